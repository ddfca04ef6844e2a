package main

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// nestedCorp runs a corp trustbridge allowing spiffe://corp.example/region/eu
// with workload DNS names from template ("" for none) and downstream DNS
// domains dnsDomains (--downstream-dns-domain), and returns a region's
// options under it (--upstream trustbridge, with an SVID corp issued) and
// the file of corp's roots.
func nestedCorp(t *testing.T, template string, dnsDomains ...string) (server.Config, string) {
	t.Helper()
	corpDir := t.TempDir()
	corp := baseServerOptions("corp.example", corpDir)
	corp.GRPC.Listen = "127.0.0.1:0"
	corp.GRPC.Downstream.Allow = []string{"spiffe://corp.example/region/eu"}
	corp.GRPC.WorkloadDNSNameTemplate = template
	corp.GRPC.Downstream.DNSDomains = dnsDomains
	_, banner, _ := launchServer(t, corp)
	creds := filepath.Join(t.TempDir(), "upstream")
	_, stderr, code := runCLIAt(t, time.Now, "", "ca", "issue", "--data-dir", corpDir, "--spiffe-id", "spiffe://corp.example/region/eu", "--credentials-dir", creds, "--ttl", "1h")
	require.Equal(t, 0, code, stderr)
	region := baseServerOptions("corp.example", t.TempDir())
	region.Upstream = server.UpstreamConfig{Kind: server.UpstreamTrustbridge, TTL: 24 * time.Hour, Trustbridge: server.TrustbridgeUpstreamConfig{
		Address: servertest.GRPCAddr(t, banner), RootCert: filepath.Join(creds, caclient.RootsFile), ProvCert: creds, Timeout: 10 * time.Second}}
	region.GRPC.Listen = "127.0.0.1:0"
	return region, filepath.Join(creds, caclient.RootsFile)
}

// Issue 32 item 4, end to end: corp's intermediate for a region permits
// the DNS names of corp's --workload-dns-name-template zone and of its
// --downstream-dns-domain only. A region whose template and
// --grpc-dns-names lie in them starts, and a client checking the region's
// certificate service by host name against corp's roots accepts it.
func TestNestedTrustServersDNSNamesInZone(t *testing.T) {
	for _, tc := range []struct {
		name, corpTemplate, regionTemplate, serving string
		corpDomains                                 []string
	}{
		{"corp's template zone", "{sa}.{ns}.svc.cluster.local", "{sa}.{ns}.svc.cluster.local", "trustbridge.eu.svc.cluster.local", nil},
		{"corp's --downstream-dns-domain, no template", "", "", "ca.trustbridge.eu.internal", []string{"trustbridge.eu.internal"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testRegionServingName(t, tc.corpTemplate, tc.corpDomains, tc.regionTemplate, tc.serving)
		})
	}
}

func testRegionServingName(t *testing.T, corpTemplate string, corpDomains []string, regionTemplate, serving string) {
	region, corpRoots := nestedCorp(t, corpTemplate, corpDomains...)
	region.GRPC.WorkloadDNSNameTemplate = regionTemplate
	region.GRPC.DNSNames = []string{serving}
	_, banner, _ := launchServer(t, region)

	roots, err := caclient.ReadPEMCerts(corpRoots)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	conn, err := tls.Dial("tcp", servertest.GRPCAddr(t, banner), &tls.Config{RootCAs: pool, ServerName: serving, NextProtos: []string{"h2"}})
	require.NoError(t, err, "the region's serving name verifies against corp's roots")
	_ = conn.Close()
}

// A region whose --grpc-dns-names corp's intermediate does not permit
// (corp has no template, so it permits no DNS name) refuses that
// intermediate rather than serve a certificate no client can verify. It
// starts, not ready, and says why (the refusal names the flag) in
// /readyz, its log, its metrics and its snapshot; its certificate
// service serves no certificate at all, and it asks again only at the
// longest backoff.
func TestNestedTrustServersDNSNamesRefused(t *testing.T) {
	region, _ := nestedCorp(t, "")
	region.GRPC.DNSNames = []string{"trustbridge.eu.internal"}
	admin, logs, _ := launchServer(t, region)

	const refusal = `excludes every DNS name, so the serving certificate's DNS name "trustbridge.eu.internal" (--grpc-dns-names) would not verify`
	status, body := servertest.Get(t, "http://"+admin+"/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.True(t, strings.HasPrefix(body, "not ready: upstream authority: the upstream refused to sign our intermediate, and will until what this names is fixed: "), body)
	assert.Contains(t, body, refusal)
	assert.Contains(t, body, "; next attempt in 5m0s")
	assert.Contains(t, logs, "upstream authority request failed: refused")
	assert.Equal(t, 1.0, servertest.MetricVia(t, http.DefaultClient, admin, "trustbridge_ca_upstream_requests_total", `result="refused"`))
	snap := servertest.GetSnapshot(t, "http://"+admin)
	require.NotNil(t, snap.CA)
	require.NotNil(t, snap.CA.Upstream)
	assert.True(t, snap.CA.Upstream.Refused)
	assert.Contains(t, snap.CA.Upstream.LastError, refusal)

	_, err := tls.Dial("tcp", servertest.GRPCAddr(t, logs), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) //nolint:gosec // the handshake must fail before any verification
	assert.ErrorContains(t, err, "internal error", "no serving certificate corp's roots do not vouch for, and none at all")
}
