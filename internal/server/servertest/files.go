package servertest

import (
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// LaptopToken is the bootstrap token a test writes for LaptopID.
const LaptopToken = "laptop-bootstrap-token-0123456789"

// CIIssuerYAML is a minimal --oidc-config with one issuer.
const CIIssuerYAML = `issuers:
- name: ci
  issuer: https://ci.example.com
  audiences: [example.org]
  claims:
  - claim: repository_owner_id
    values: ["1342004"]
  spiffeID: "spiffe://{{.TrustDomain}}/ci/{{.Claims.repository_id}}"
`

// GoodPolicy is a valid trust policy: deny by default, payments may
// talk to partner.example's billing API.
const GoodPolicy = `default: deny
rules:
- name: payments-to-partner
  workloads:
  - spiffeID: spiffe://example.org/ns/payments/*
  trustDomains:
  - name: partner.example
    peers: [spiffe://partner.example/ns/billing/sa/api]
`

// LaptopID is the SPIFFE ID the tests' bootstrap token (LaptopToken) names.
var LaptopID = spiffeid.RequireFromString("spiffe://example.org/vm/laptop")

// BadPolicy is a trust policy the server refuses: a rule without workloads.
const BadPolicy = `rules:
- name: payments-to-partner
  workloads:
  - spiffeID: spiffe://example.org/ns/payments/*
  trustDomains:
  - name: partner.example
- name: broken
  workloads: []
  trustDomains:
  - name: partner.example
`

// NoEnv is a getenv with no variables set.
func NoEnv(string) string { return "" }

// ReservePort returns a loopback address that was free a moment ago.
func ReservePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// SPIFFEBundle is the SPIFFE bundle of td with roots as its X.509 authorities.
func SPIFFEBundle(t testing.TB, td string, roots ...*x509.Certificate) *spiffebundle.Bundle {
	t.Helper()
	return spiffebundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString(td), roots)
}

// WebPeers is a federation config naming tds as https_web peers on
// loopback port 1, where nothing listens.
func WebPeers(tds ...string) string {
	var b strings.Builder
	b.WriteString("federation:\n")
	for _, td := range tds {
		// Loopback, nothing listening: polls fail without leaving the host.
		fmt.Fprintf(&b, "  - trustDomain: %s\n    bundleEndpointURL: https://127.0.0.1:1/%s\n    bundleEndpointProfile:\n      type: https_web\n", td, td)
	}
	return b.String()
}

// WriteBundleDoc writes ca's bundle as a SPIFFE bundle document at path.
func WriteBundleDoc(t testing.TB, path string, ca *testca.CA) {
	t.Helper()
	doc, err := bundledoc.Marshal(ca.Bundle())
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, doc, 0o600))
}

// WriteConfig writes text as a trustbridge.yaml in a temporary directory
// and returns its path.
func WriteConfig(t testing.TB, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trustbridge.yaml")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
	return path
}

// WriteFile writes data with perm to a file in a temporary directory and
// returns its path.
func WriteFile(t testing.TB, data string, perm os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(p, []byte(data), perm))
	return p
}

// WriteKubeconfig writes a kubeconfig for host, with the CA and client
// credentials of from when given.
func WriteKubeconfig(t testing.TB, host string, from *kubetest.Env) string {
	t.Helper()
	cluster := &clientcmdapi.Cluster{Server: host}
	user := &clientcmdapi.AuthInfo{}
	if from != nil {
		c := from.Config
		cluster.CertificateAuthorityData = c.CAData
		user.ClientCertificateData, user.ClientKeyData, user.Token = c.CertData, c.KeyData, c.BearerToken
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = cluster
	cfg.AuthInfos["test"] = user
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	cfg.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*cfg, path))
	return path
}

// WritePolicy writes body as dir/policy.yaml and returns its path.
func WritePolicy(t testing.TB, dir, body string) string {
	t.Helper()
	path := filepath.Join(dir, "policy.yaml")
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}

// WriteSPIFFEFederationConfig writes a federation config naming peer's
// https_spiffe endpoint at addr with peerRoots as its bootstrap bundle.
func WriteSPIFFEFederationConfig(t testing.TB, peer, addr string, peerRoots []*x509.Certificate) string {
	t.Helper()
	dir := t.TempDir()
	doc, err := bundledoc.Marshal(SPIFFEBundle(t, peer, peerRoots...))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "peer.json"), doc, 0o600))
	cfg := fmt.Sprintf(`federation:
  - trustDomain: %s
    bundleEndpointURL: https://%s/
    bundleEndpointProfile:
      type: https_spiffe
      endpointSPIFFEID: spiffe://%s/trustbridge/bundle-endpoint
    trustDomainBundleFile: peer.json
`, peer, addr, peer)
	path := filepath.Join(dir, "federation.yaml")
	require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
	return path
}

// WriteTokenFile writes lines as a bootstrap token file (tokens.csv) in a
// temporary directory and returns its path.
func WriteTokenFile(t testing.TB, lines string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens.csv")
	require.NoError(t, os.WriteFile(p, []byte(lines), 0o600))
	return p
}
