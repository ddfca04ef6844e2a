package main

import (
	"crypto/tls"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/sds"
)

// TestNestedTrustServers runs a corp trustbridge allowing
// spiffe://corp.example/region/eu and a region trustbridge under it
// (--upstream trustbridge, authenticating with an SVID corp issued): a
// certificate from the region's certificate service verifies against
// corp's roots, its chain is leaf then the region's intermediate; the
// region renews only certificates its own CA issued.
func TestNestedTrustServers(t *testing.T) {
	corpDir := t.TempDir()
	corp := baseServerOptions("corp.example", corpDir)
	corp.GRPC.Listen = "127.0.0.1:0"
	corp.GRPC.Downstream.Allow = []string{"spiffe://corp.example/region/eu"}
	_, banner, _ := launchServer(t, corp)
	addr := servertest.GRPCAddr(t, banner)

	creds := filepath.Join(t.TempDir(), "upstream")
	_, stderr, code := runCLIAt(t, time.Now, "", "ca", "issue", "--data-dir", corpDir, "--spiffe-id", "spiffe://corp.example/region/eu", "--credentials-dir", creds, "--ttl", "1h")
	require.Equal(t, 0, code, stderr)

	regionDir := t.TempDir()
	region := baseServerOptions("corp.example", regionDir)
	region.Upstream = server.UpstreamConfig{Kind: server.UpstreamTrustbridge, TTL: 24 * time.Hour, Trustbridge: server.TrustbridgeUpstreamConfig{
		Address: addr, RootCert: filepath.Join(creds, caclient.RootsFile), ProvCert: creds, Timeout: 10 * time.Second}}
	region.GRPC.Listen = "127.0.0.1:0"
	regionAdmin, regionBanner, _ := launchServer(t, region)

	// An SVID corp issued verifies at the region (one trust domain), but
	// the region's CA did not sign it, so its grant is not the region's:
	// no renewal there.
	workload := filepath.Join(t.TempDir(), "workload")
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", servertest.GRPCAddr(t, regionBanner), "--root-cert", filepath.Join(creds, caclient.RootsFile),
		"--prov-cert", creds, "--credentials-dir", workload)
	require.NotEqual(t, 0, code)
	assert.Contains(t, stderr, "not issued by this server's CA")

	// The region's certificate service, verified with corp's roots, signs
	// for a caller proving an SVID the region issued.
	regionCreds := filepath.Join(t.TempDir(), "region-issued")
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "issue", "--data-dir", regionDir, "--spiffe-id", "spiffe://corp.example/region/eu", "--credentials-dir", regionCreds, "--ttl", "1h")
	require.Equal(t, 0, code, stderr)
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", servertest.GRPCAddr(t, regionBanner), "--root-cert", filepath.Join(creds, caclient.RootsFile),
		"--prov-cert", regionCreds, "--credentials-dir", workload)
	require.Equal(t, 0, code, stderr)

	chain, err := caclient.ReadPEMCerts(filepath.Join(workload, caclient.ChainFile))
	require.NoError(t, err)
	require.Len(t, chain, 2, "leaf, then the region's intermediate")
	assert.True(t, chain[1].IsCA)
	assert.True(t, chain[1].MaxPathLenZero)
	corpRoots, err := os.ReadFile(filepath.Join(creds, caclient.RootsFile))
	require.NoError(t, err)
	td := spiffeid.RequireTrustDomainFromString("corp.example")
	bundle, err := x509bundle.Parse(td, corpRoots)
	require.NoError(t, err)
	id, _, err := x509svid.Verify(chain, bundle)
	require.NoError(t, err)
	assert.Equal(t, "spiffe://corp.example/region/eu", id.String())

	// What leaves the region for peers and workloads is corp's roots,
	// never its intermediate: the bundle it publishes (the admin API's
	// /v1/bundle, the document its bundle endpoint serves) and SDS's
	// ROOTCA, asked for by a workload with the certificate it was just
	// issued.
	status, body := servertest.Get(t, "http://"+regionAdmin+"/v1/bundle")
	require.Equal(t, http.StatusOK, status)
	published, err := spiffebundle.Parse(td, []byte(body))
	require.NoError(t, err)
	sameCerts(t, bundle.X509Authorities(), published.X509Authorities(), "the region publishes corp's roots only")
	cert, err := tls.LoadX509KeyPair(filepath.Join(workload, caclient.ChainFile), filepath.Join(workload, caclient.KeyFile))
	require.NoError(t, err)
	store := trust.NewStore()
	store.Set("bootstrap", spiffebundle.FromX509Authorities(td, bundle.X509Authorities()))
	tlsCfg := trust.ClientTLSConfig(func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil },
		&trust.Verifier{Bundles: store, Authorizer: tlsconfig.AuthorizeID(spiffeid.RequireFromPath(td, server.GRPCServingPath))})
	conn, err := grpc.NewClient(servertest.GRPCAddr(t, regionBanner), grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	sdsGot := secrets(t, openEnvoy(t, conn, nil, sds.RootCAName).recv(10*time.Second))
	require.Contains(t, sdsGot, sds.RootCAName)
	sameCerts(t, bundle.X509Authorities(), trustedCA(t, sdsGot[sds.RootCAName]), "SDS ROOTCA holds corp's roots only")

	// ca issue on the region's data directory signs with the same
	// intermediate: its chain carries it, and its root file holds corp's
	// roots, never the intermediate.
	issued := filepath.Join(t.TempDir(), "issued")
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "issue", "--data-dir", regionDir, "--spiffe-id", "spiffe://corp.example/vm/db", "--credentials-dir", issued, "--ttl", "1h")
	require.Equal(t, 0, code, stderr)
	chain, err = caclient.ReadPEMCerts(filepath.Join(issued, caclient.ChainFile))
	require.NoError(t, err)
	require.Len(t, chain, 2, "leaf, then the region's intermediate")
	id, _, err = x509svid.Verify(chain, bundle)
	require.NoError(t, err)
	assert.Equal(t, "spiffe://corp.example/vm/db", id.String())
	roots, err := caclient.ReadPEMCerts(filepath.Join(issued, caclient.RootsFile))
	require.NoError(t, err)
	for _, r := range roots {
		assert.False(t, r.Equal(chain[1]), "the intermediate is not a root")
	}

	// The region's snapshot names its upstream, healthy, and the audit
	// judges the 24h intermediate by the upstream findings, not as a root
	// about to expire; the default 90-day leaves do not fit under it.
	out, stderr, code := runCLI(t, "", "audit", "--admin", "http://"+regionAdmin, "-o", "json", "--fail-on", "none")
	require.Equal(t, 0, code, stderr)
	var findings []api.Finding
	require.NoError(t, json.Unmarshal([]byte(out), &findings))
	got := map[string]bool{}
	for _, f := range findings {
		got[f.Code] = true
	}
	assert.Equal(t, map[string]bool{audit.CodeIntermediateShort: true}, got, out)
	status, body = servertest.Get(t, "http://"+regionAdmin+"/v1/snapshot")
	require.Equal(t, http.StatusOK, status)
	var snap api.Snapshot
	require.NoError(t, json.Unmarshal([]byte(body), &snap))
	require.NotNil(t, snap.CA)
	require.NotNil(t, snap.CA.Upstream)
	assert.Equal(t, "trustbridge upstream "+addr, snap.CA.Upstream.Name)
	assert.NotNil(t, snap.CA.Upstream.LastSuccess)
	assert.Zero(t, snap.CA.Upstream.Failures)
}
