package server

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/federation/managed"
)

// The text banner and the JSON start-up records list the same peers:
// those of flags and files and those added at run time (federation add),
// which the banner used to leave out.
func TestBannerAndRecordsListTheSamePeers(t *testing.T) {
	static, err := federation.ParseEndpoints("web.example|https://web.example/bundle")
	require.NoError(t, err)
	added, err := federation.ParseEndpoints("added.example|https://added.example/bundle")
	require.NoError(t, err)
	fed := &federationSetup{static: static, origins: map[spiffeid.TrustDomain]string{static[0].TrustDomain: "flag"},
		runtime: &runtimeFederation{inForce: managed.State{Endpoints: added}}}

	var banner bytes.Buffer
	printPeers(&banner, fed)
	assert.Equal(t, "  federates:  added.example https://added.example/bundle (https_web, from "+OriginRuntime+")\n"+
		"              web.example https://web.example/bundle (https_web, from flag)\n", banner.String())

	var logs bytes.Buffer
	logPeers(fed, slog.New(slog.NewJSONHandler(&logs, nil)))
	var logged []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var r map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &r))
		logged = append(logged, r["trust_domain"].(string)+" "+r["origin"].(string))
	}
	assert.Equal(t, []string{"added.example " + OriginRuntime, "web.example flag"}, logged)
}
