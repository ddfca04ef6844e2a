package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var bootstrap = regexp.MustCompile(`^curl -s (\S+) > (\S+)$`)

// The start-up record's tuple and bootstrap command, used verbatim by a peer's
// operator, federate: the tuple names the bundle file the command writes
// (issue 21 item 5).
func TestBannerTupleFederates(t *testing.T) {
	_, eastBanner, _ := startNamedServer(t, "east.example", nil)
	tuple := []string{"", servertest.LogAttr(t, eastBanner, servertest.BundleEndpointStarted, "tuple")}
	cmd := bootstrap.FindStringSubmatch(servertest.LogAttr(t, eastBanner, servertest.BundleEndpointStarted, "bootstrap"))
	require.NotNil(t, cmd, eastBanner)
	assert.True(t, strings.HasSuffix(tuple[1], "|spiffe://east.example/trustbridge/bundle-endpoint|"+cmd[2]), "the tuple names the file the command writes:\n%s", eastBanner)

	// West's operator runs the command in the directory west starts in.
	dir := t.TempDir()
	t.Chdir(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cmd[1], nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	doc, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(doc))
	require.NoError(t, os.WriteFile(cmd[2], doc, 0o600))

	westAdmin, _, _ := startNamedServer(t, "west.example", func(o *Config) { o.Federation.Federate = tuple[1] })
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		code, body := servertest.Get(t, "http://"+westAdmin+"/v1/federation")
		var status []api.FederationStatus
		if !assert.Equal(c, http.StatusOK, code) || !assert.NoError(c, json.Unmarshal([]byte(body), &status)) || !assert.Len(c, status, 1) {
			return
		}
		assert.Equal(c, string(federation.StateOK), status[0].State, status[0].LastError)
	}, 15*time.Second, 20*time.Millisecond, "west federates with east over the banner's tuple")
}

// A peer whose bundle is served by a hub of another trust domain,
// hub.example, which nothing here federates with.
const (
	hubServedTuple = "peer.example|https://hub.example:8443/peer|spiffe://hub.example/bundle-server"
	hubServedYAML  = `federation:
  - trustDomain: peer.example
    bundleEndpointURL: https://hub.example:8443/peer
    bundleEndpointProfile:
      type: https_spiffe
      endpointSPIFFEID: spiffe://hub.example/bundle-server
`
)

// The same peer is accepted once hub.example's roots will be in the trust
// store: served by our own trust domain, hub.example federated with its
// bundle by the flag or the file (either way round), or a stored bundle of
// hub.example; a cycle of peers serving each other is refused until one
// has its bundle.
func TestHubServedPeerAcceptedWhenServerAnchored(t *testing.T) {
	local := spiffeid.RequireTrustDomainFromString("example.org")
	dir := t.TempDir()
	hubFile := filepath.Join(dir, "hub.example.json")
	servertest.WriteBundleDoc(t, hubFile, testca.New(t, "hub.example"))
	hubTuple := "hub.example|https://hub.example:8443/|spiffe://hub.example/bundle-server"
	fedFile := filepath.Join(dir, "federation.yaml")
	require.NoError(t, os.WriteFile(fedFile, []byte(hubServedYAML+`  - trustDomain: hub.example
    bundleEndpointURL: https://hub.example:8443/
    bundleEndpointProfile:
      type: https_spiffe
      endpointSPIFFEID: spiffe://hub.example/bundle-server
    trustDomainBundleFile: hub.example.json
`), 0o600))
	hubOnlyFile := filepath.Join(dir, "hub-only.yaml")
	require.NoError(t, os.WriteFile(hubOnlyFile, []byte(`federation:
  - trustDomain: hub.example
    bundleEndpointURL: https://hub.example:8443/
    bundleEndpointProfile:
      type: https_spiffe
      endpointSPIFFEID: spiffe://hub.example/bundle-server
    trustDomainBundleFile: hub.example.json
`), 0o600))
	storeDir := t.TempDir()
	require.NoError(t, federation.NewLKGStore(storeDir).Save(federation.LKGEntry{
		TrustDomain: spiffeid.RequireTrustDomainFromString("hub.example"), Bundle: testca.New(t, "hub.example").Bundle(),
		EndpointURL: "https://hub.example:8443/", FetchedAt: time.Now(),
	}))
	lkg := federation.NewLKGStore(storeDir)

	aViaB := "a.example|https://b.example/a|spiffe://b.example/bundle-server"
	bViaA := "b.example|https://a.example/b|spiffe://a.example/bundle-server"
	bFile := filepath.Join(dir, "b.example.json")
	servertest.WriteBundleDoc(t, bFile, testca.New(t, "b.example"))

	tests := []struct {
		name string
		o    FederationConfig
		held func(spiffeid.TrustDomain) bool
		want string // "" accepted, else a part of the refusal
	}{
		{"served by our trust domain", FederationConfig{Federate: "peer.example|https://bundles.example.org/peer|spiffe://example.org/bundle-server"}, nil, ""},
		{"hub by flag with its bundle", FederationConfig{Federate: hubServedTuple + "||" + hubTuple + "|" + hubFile}, nil, ""},
		{"hub by flag with its bundle, listed first", FederationConfig{Federate: hubTuple + "|" + hubFile + "||" + hubServedTuple}, nil, ""},
		{"peer and hub in one file", FederationConfig{ConfigFile: fedFile}, nil, ""},
		{"peer by flag, hub in a file", FederationConfig{Federate: hubServedTuple, ConfigFile: hubOnlyFile}, nil, ""},
		{"hub stored", FederationConfig{Federate: hubServedTuple}, func(d spiffeid.TrustDomain) bool { return federation.StoreHolds(lkg, d) }, ""},
		{"hub by flag without its bundle", FederationConfig{Federate: hubServedTuple + "||" + hubTuple}, nil, "hub.example is federated here by \"hub.example|https://hub.example:8443/|spiffe://hub.example/bundle-server\""},
		{"cycle", FederationConfig{Federate: aViaB + "||" + bViaA}, nil, "b.example is federated here by"},
		{"cycle, b.example with its bundle", FederationConfig{Federate: aViaB + "||" + bViaA + "|" + bFile}, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, _, err := StaticEndpoints(tt.o, local, tt.held)
			if tt.want == "" {
				assert.NoError(t, err)
			} else {
				assert.ErrorContains(t, err, tt.want)
			}
		})
	}
}
