package main

import (
	"crypto/x509"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// A self-serving https_spiffe peer without its bootstrap bundle.
const (
	unanchoredTuple = "peer.example|https://peer.example:8443/|spiffe://peer.example/trustbridge/bundle-endpoint"
	unanchoredYAML  = `federation:
  - trustDomain: peer.example
    bundleEndpointURL: https://peer.example:8443/
    bundleEndpointProfile:
      type: https_spiffe
      endpointSPIFFEID: spiffe://peer.example/trustbridge/bundle-endpoint
`
)

// unanchoredRefusal is federation.CheckFirstFetch's message for the peer:
// every path must give exactly it.
func unanchoredRefusal(t *testing.T) string {
	t.Helper()
	eps, err := federation.ParseEndpoints(unanchoredTuple)
	require.NoError(t, err)
	err = federation.CheckFirstFetch(eps[0], nil)
	require.ErrorIs(t, err, federation.ErrNoBootstrapBundle)
	return err.Error()
}

// Flag, environment, files, config check and the server itself refuse the
// peer with the same message (issue 21 item 5; the resources' path is
// federation/crd's TestJudgeRefusesUnanchoredPeer).
func TestUnanchoredSPIFFEPeerRefusedOnEveryPath(t *testing.T) {
	refusedOnEveryPath(t, unanchoredTuple, unanchoredYAML, unanchoredRefusal(t))
}

// refusedOnEveryPath checks that --federate, SPIFFE_BUNDLE_ENDPOINTS,
// --federation-config, config check and the server refuse the peer of
// tuple (or of the federation list yaml, whose first entry it is) with the
// message want.
func refusedOnEveryPath(t *testing.T, tuple, yaml, want string) {
	t.Helper()
	local := spiffeid.RequireTrustDomainFromString("example.org")
	dir := t.TempDir()
	fedFile := filepath.Join(dir, "federation.yaml")
	require.NoError(t, os.WriteFile(fedFile, []byte(yaml), 0o600))
	configFile := filepath.Join(dir, "config.yaml")
	require.NoError(t, os.WriteFile(configFile, []byte("trust-domain: example.org\ndata-dir: "+t.TempDir()+"\n"+yaml), 0o600))

	t.Run("--federate", func(t *testing.T) {
		_, _, _, err := server.StaticEndpoints(server.FederationConfig{Federate: tuple}, local, nil)
		assert.EqualError(t, err, "--federate "+tuple+": "+want)
	})
	t.Run("SPIFFE_BUNDLE_ENDPOINTS", func(t *testing.T) {
		t.Setenv("SPIFFE_BUNDLE_ENDPOINTS", tuple)
		_, _, _, err := server.StaticEndpoints(server.FederationConfig{}, local, nil)
		assert.EqualError(t, err, "--federate "+tuple+": "+want)
	})
	t.Run("--federation-config", func(t *testing.T) {
		_, _, _, err := server.StaticEndpoints(server.FederationConfig{ConfigFile: fedFile}, local, nil)
		assert.EqualError(t, err, "--federation-config "+fedFile+": federation[0] (peer.example): "+want)
	})
	t.Run("config check", func(t *testing.T) {
		t.Setenv("TRUST_DOMAIN", "")
		t.Setenv("SPIFFE_BUNDLE_ENDPOINTS", "")
		stdout, _, code := runCLI(t, "", "config", "check", configFile)
		assert.Equal(t, 1, code)
		assert.Contains(t, stdout, "federation[0] (peer.example): "+want)
	})
	t.Run("server", func(t *testing.T) {
		t.Setenv("SPIFFE_BUNDLE_ENDPOINTS", "")
		_, stderr, code := runCLI(t, "", "server", "--trust-domain", "example.org", "--data-dir", t.TempDir(),
			"--admin-listen", "127.0.0.1:0", "--bundle-listen", "", "--grpc-listen", "", "--federate", tuple)
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr, want)
	})
}

// A last-known-good bundle of the peer's trust domain authenticates the
// first fetch, so the same configuration is accepted: the server restores
// it before polling, and config check reads the same store.
func TestUnanchoredSPIFFEPeerAcceptedWhenHeld(t *testing.T) {
	dataDir := t.TempDir()
	peer := testca.New(t, "peer.example")
	require.NoError(t, federation.NewLKGStore(dataDir).Save(federation.LKGEntry{
		TrustDomain: peer.TrustDomain, Bundle: peer.Bundle(), EndpointURL: "https://peer.example:8443/", FetchedAt: time.Now(),
	}))

	configFile := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(configFile, []byte("trust-domain: example.org\ndata-dir: "+dataDir+"\n"+unanchoredYAML), 0o600))
	t.Setenv("TRUST_DOMAIN", "")
	t.Setenv("SPIFFE_BUNDLE_ENDPOINTS", "")
	stdout, _, code := runCLI(t, "", "config", "check", configFile)
	assert.Equal(t, 0, code, stdout)

	o := baseServerOptions("example.org", dataDir)
	o.Federation.Federate = unanchoredTuple
	o.Init = true // the directory holds the peer's bundle but no CA state yet
	admin, _, _ := launchServer(t, o)
	code, body := servertest.Get(t, "http://"+admin+"/v1/federation")
	require.Equal(t, http.StatusOK, code)
	var status []api.FederationStatus
	require.NoError(t, json.Unmarshal([]byte(body), &status))
	require.Len(t, status, 1)
	assert.Equal(t, "peer.example", status[0].TrustDomain)
	require.Len(t, status[0].Authorities, 1, "the stored bundle is held")
}

// https_web peers need no bundle: the tuple stays Istio's two fields and
// there is no bootstrap line.
func TestBannerWebTupleHasNoBootstrap(t *testing.T) {
	dir := t.TempDir()
	web := testca.New(t, "web.test")
	certFile, keyFile := writeWebCert(t, dir, web)
	_, out := startServer(t, t.TempDir(), func(o *server.Config) {
		o.Bundle = server.BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: server.ProfileWeb, TLSCert: certFile, TLSKey: keyFile, ServeOthers: true}
	})
	tuple := servertest.LogAttr(t, out.String(), servertest.BundleEndpointStarted, "tuple")
	assert.Equal(t, 2, strings.Count(tuple, "|")+1, tuple)
	assert.NotContains(t, servertest.LogRecord(out.String(), servertest.BundleEndpointStarted), "bootstrap")
}

// writeWebCert writes a Web PKI serving certificate for 127.0.0.1 from web.
func writeWebCert(t *testing.T, dir string, web *testca.CA) (certFile, keyFile string) {
	t.Helper()
	leaf, key := web.Issue(t, spiffeid.RequireFromString("spiffe://web.test/x"), testca.Options{Mutate: func(c *x509.Certificate) {
		c.URIs = nil
		c.DNSNames = []string{"localhost"}
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}})
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	require.NoError(t, os.WriteFile(certFile, cli.CertsPEM([]*x509.Certificate{leaf}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pemBlock("PRIVATE KEY", der), 0o600))
	return certFile, keyFile
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

// Flag, environment, files, config check and the server itself refuse a
// peer served by a trust domain whose roots nothing brings in, with the
// same message, naming the fix: federate with hub.example too, with its
// bundle (issue 21 item 5; the resources' path is federation/crd's
// TestJudgeServedByAnotherTrustDomain).
func TestHubServedPeerRefusedOnEveryPath(t *testing.T) {
	eps, err := federation.ParseEndpoints(hubServedTuple)
	require.NoError(t, err)
	refusal := federation.CheckFirstFetch(eps[0], nil)
	require.ErrorIs(t, refusal, federation.ErrNoServerBundle)
	want := refusal.Error()
	assert.Contains(t, want, "federate with hub.example too")

	refusedOnEveryPath(t, hubServedTuple, hubServedYAML, want)

	// The peer's own bundle does not authenticate hub.example's server.
	peerFile := filepath.Join(t.TempDir(), "peer.example.json")
	servertest.WriteBundleDoc(t, peerFile, testca.New(t, "peer.example"))
	peerWant := federation.CheckFirstFetch(federation.Endpoint{
		TrustDomain: eps[0].TrustDomain, URL: eps[0].URL, Profile: eps[0].Profile, EndpointSPIFFEID: eps[0].EndpointSPIFFEID,
		BootstrapBundle: testca.New(t, "peer.example").Bundle(),
	}, nil).Error()
	_, _, _, err = server.StaticEndpoints(server.FederationConfig{Federate: hubServedTuple + "|" + peerFile}, spiffeid.RequireTrustDomainFromString("example.org"), nil)
	assert.EqualError(t, err, "--federate "+hubServedTuple+": "+peerWant)
}

// TestHubServedPeerAnchoredByARelayedFile: a bundle file the endpoint
// relays ("--bundle-file hub.example=FILE") puts hub.example's roots in the
// trust store before any fetch, so it anchors a peer that hub.example
// serves, at start and in config check alike; without the bundle endpoint
// the file is never read, and the peer is refused.
func TestHubServedPeerAnchoredByARelayedFile(t *testing.T) {
	dir := t.TempDir()
	hubFile := filepath.Join(dir, "hub.example.json")
	servertest.WriteBundleDoc(t, hubFile, testca.New(t, "hub.example"))
	relay := server.BundleConfig{Listen: "127.0.0.1:0", Files: []string{"hub.example=" + hubFile, "not a spec=" + hubFile, dir + "/local.json"}}
	assert.Equal(t, []spiffeid.TrustDomain{spiffeid.RequireTrustDomainFromString("hub.example")}, server.RelayedTrustDomains(relay))
	off := relay
	off.Listen = ""
	assert.Empty(t, server.RelayedTrustDomains(off), "no bundle endpoint: the files are not read")

	local := spiffeid.RequireTrustDomainFromString("example.org")
	_, _, _, err := server.StaticEndpoints(server.FederationConfig{Federate: hubServedTuple}, local, server.OrRelayed(nil, server.RelayedTrustDomains(relay)))
	require.NoError(t, err)
	_, _, _, err = server.StaticEndpoints(server.FederationConfig{Federate: hubServedTuple}, local, server.OrRelayed(nil, server.RelayedTrustDomains(off)))
	require.ErrorIs(t, err, federation.ErrNoServerBundle)

	t.Setenv("TRUST_DOMAIN", "")
	t.Setenv("SPIFFE_BUNDLE_ENDPOINTS", "")
	for _, tt := range []struct {
		listen string
		code   int
	}{{"127.0.0.1:0", 0}, {`""`, 1}} {
		configFile := filepath.Join(t.TempDir(), "config.yaml")
		require.NoError(t, os.WriteFile(configFile, []byte("trust-domain: example.org\ndata-dir: "+t.TempDir()+
			"\nbundle-profile: https_web\nbundle-listen: "+tt.listen+"\nbundle-file: [\"hub.example="+hubFile+"\"]\nfederate: \""+hubServedTuple+"\"\n"), 0o600))
		stdout, _, code := runCLI(t, "", "config", "check", configFile)
		assert.Equal(t, tt.code, code, "bundle-listen %s: %s", tt.listen, stdout)
	}
}
