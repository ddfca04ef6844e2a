package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	gofederation "github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// startNamedServer runs a server for td with its bundle endpoint on
// loopback and returns its admin address, banner and data dir.
func startNamedServer(t *testing.T, td string, mutate func(*server.Config)) (admin, banner, dataDir string) {
	t.Helper()
	dataDir = t.TempDir()
	o := baseServerOptions(td, dataDir)
	o.Bundle = server.BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: server.ProfileSPIFFE, ServeOthers: true}
	o.Federation.AllowPrivate = true
	if mutate != nil {
		mutate(&o)
	}
	admin, banner, _ = launchServer(t, o)
	return admin, banner, dataDir
}

func TestServerFederatesOverHTTPSSPIFFE(t *testing.T) {
	_, eastBanner, eastData := startNamedServer(t, "east.example", nil)
	eastURL := servertest.EndpointURL(t, eastBanner)

	// The operator hands west east's bundle once (https_spiffe bootstrap).
	eastState, roots, err := ca.NewStore(eastData).Load("east.example")
	require.NoError(t, err)
	eastBundle := roots[0].Cert
	eastSeq := eastState.Sequence
	doc, err := bundledoc.Marshal(servertest.SPIFFEBundle(t, "east.example", eastBundle))
	require.NoError(t, err)
	cfgDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(cfgDir, "east.json"), doc, 0o600))
	cfg := "federation:\n  - trustDomain: east.example\n    bundleEndpointURL: " + eastURL +
		"\n    bundleEndpointProfile: {type: https_spiffe, endpointSPIFFEID: spiffe://east.example/trustbridge/bundle-endpoint}\n    trustDomainBundleFile: east.json\n"
	require.NoError(t, os.WriteFile(filepath.Join(cfgDir, "federation.yaml"), []byte(cfg), 0o600))

	westAdmin, westBanner, westData := startNamedServer(t, "west.example", func(o *server.Config) {
		o.Federation.ConfigFile = filepath.Join(cfgDir, "federation.yaml")
	})

	// The first poll happens at start; wait for it through the status API.
	var status []api.FederationStatus
	require.Eventually(t, func() bool {
		code, body := servertest.Get(t, "http://"+westAdmin+"/v1/federation")
		if code != 200 || json.Unmarshal([]byte(body), &status) != nil || len(status) != 1 {
			return false
		}
		return status[0].LastSuccess != nil
	}, 15*time.Second, 20*time.Millisecond)
	s := status[0]
	assert.Equal(t, "east.example", s.TrustDomain)
	assert.Equal(t, string(federation.StateOK), s.State)
	assert.Equal(t, eastSeq, *s.Sequence, "the sequence east published")
	require.Len(t, x509Held(s.Authorities), 1)
	assert.Equal(t, "spiffe://east.example/trustbridge/bundle-endpoint", s.EndpointSPIFFEID)

	// West relays east's bundle as east published it, sequence included.
	westURL := strings.TrimSuffix(servertest.EndpointURL(t, westBanner), "/")
	_, westRoots, err := ca.NewStore(westData).Load("west.example")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The endpoint re-renders from the trust store just after the poller
	// reports success: wait for it rather than race it.
	var relayed *spiffebundle.Bundle
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		b, err := gofederation.FetchBundle(ctx, spiffeid.RequireTrustDomainFromString("east.example"), westURL+"/bundles/east.example",
			gofederation.WithSPIFFEAuth(x509bundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString("west.example"),
				[]*x509.Certificate{westRoots[0].Cert}), spiffeid.RequireFromString("spiffe://west.example/trustbridge/bundle-endpoint")))
		if !assert.NoError(c, err) {
			return
		}
		seq, _ := b.SequenceNumber()
		if assert.Equal(c, eastSeq, seq) {
			relayed = b
		}
	}, 10*time.Second, 20*time.Millisecond, "west relays east's bundle as east published it")
	assert.True(t, relayed.X509Authorities()[0].Equal(eastBundle))

	// The status command reads at a glance; refresh polls now.
	stdout, stderr, code := runCLIAt(t, time.Now, "", "federation", "status", "--admin", "http://"+westAdmin)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "TRUST DOMAIN")
	assert.Regexp(t, `(?m)^east\.example +OK `, stdout)
	// The first poll reports success before it has finished saving the
	// bundle; a refresh in that moment is told a poll is running.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		stdout, stderr, code = runCLIAt(t, time.Now, "", "federation", "refresh", "east.example", "--admin", "http://"+westAdmin)
		busy := strings.Contains(stderr, "already running") || strings.Contains(stderr, "429")
		assert.False(c, busy, "refused while busy: %s", stderr)
	}, 10*time.Second, 250*time.Millisecond)
	require.Equal(t, 0, code, stderr, "any other answer than busy is final")
	assert.Contains(t, stdout, "refreshed east.example")
	_, stderr, code = runCLIAt(t, time.Now, "", "federation", "refresh", "nowhere.example", "--admin", "http://"+westAdmin)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "not federated")
	// One refresh a second is internal/server/admin's TestRefreshRateLimit, on a
	// fake clock: here a slow fetch could take longer than the second.

	// A web page the operator visits cannot drive the admin API.
	req, err := http.NewRequest(http.MethodPost, "http://"+westAdmin+"/v1/federation/refresh?trust_domain=east.example", nil)
	require.NoError(t, err)
	req.Header.Set("Origin", "https://evil.example")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
}
