package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/caclient"
)

// nestedCorp runs a corp trustbridge allowing spiffe://corp.example/region/eu
// with workload DNS names from template ("" for none), and returns a region's
// options under it (--upstream trustbridge, with an SVID corp issued) and
// the file of corp's roots.
func nestedCorp(t *testing.T, template string) (serverOptions, string) {
	t.Helper()
	corpDir := t.TempDir()
	corp := baseServerOptions("corp.example", corpDir)
	corp.grpc.listen = "127.0.0.1:0"
	corp.grpc.downstream.allow = []string{"spiffe://corp.example/region/eu"}
	corp.grpc.workloadDNSNameTemplate = template
	_, banner, _ := launchServer(t, corp)
	creds := filepath.Join(t.TempDir(), "upstream")
	_, stderr, code := runCLIAt(t, time.Now, "", "ca", "issue", "--data-dir", corpDir, "--spiffe-id", "spiffe://corp.example/region/eu", "--credentials-dir", creds, "--ttl", "1h")
	require.Equal(t, 0, code, stderr)
	region := baseServerOptions("corp.example", t.TempDir())
	region.upstream = upstreamOptions{kind: upstreamTrustbridge, ttl: 24 * time.Hour, trustbridge: trustbridgeUpstreamOptions{
		address: grpcAddr(t, banner), rootCert: filepath.Join(creds, caclient.RootsFile), provCert: creds, timeout: 10 * time.Second}}
	region.grpc.listen = "127.0.0.1:0"
	return region, filepath.Join(creds, caclient.RootsFile)
}

// Issue 32 item 4, end to end: corp's intermediate for a region permits
// the DNS names of corp's --workload-dns-name-template zone only. A region
// whose template and --grpc-dns-names lie in it starts, and a client
// checking the region's certificate service by host name against corp's
// roots accepts it.
func TestNestedTrustServersDNSNamesInZone(t *testing.T) {
	region, corpRoots := nestedCorp(t, "{sa}.{ns}.svc.cluster.local")
	region.grpc.workloadDNSNameTemplate = "{sa}.{ns}.svc.cluster.local"
	region.grpc.dnsNames = []string{"trustbridge.eu.svc.cluster.local"}
	_, banner, _ := launchServer(t, region)

	roots, err := caclient.ReadPEMCerts(corpRoots)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	conn, err := tls.Dial("tcp", grpcAddr(t, banner), &tls.Config{RootCAs: pool, ServerName: "trustbridge.eu.svc.cluster.local", NextProtos: []string{"h2"}})
	require.NoError(t, err, "the region's serving name verifies against corp's roots")
	_ = conn.Close()
}

// A region whose --grpc-dns-names corp's intermediate does not permit
// (corp has no template, so it permits no DNS name) refuses that
// intermediate rather than serve a certificate no client can verify, and
// the start fails with the upstream's refusal, which names the flag.
func TestNestedTrustServersDNSNamesRefused(t *testing.T) {
	region, _ := nestedCorp(t, "")
	region.grpc.dnsNames = []string{"trustbridge.eu.internal"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e, _, logs := testEnv(t, region.logFormat)
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- runServer(ctx, e, region, ready) }()
	var err error
	select {
	case err = <-done:
	case <-ready:
		t.Fatal("the region started with a serving certificate corp's roots do not vouch for")
	}
	require.Error(t, err)
	assert.ErrorContains(t, err, `excludes every DNS name, so the serving certificate's DNS name "trustbridge.eu.internal" (--grpc-dns-names) would not verify`)
	assert.Contains(t, logs.String(), "upstream authority request failed")
}
