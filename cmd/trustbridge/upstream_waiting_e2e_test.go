package main

import (
	"crypto/tls"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// readyWithin is how long a test waits for a server to turn ready: the
// region asks its upstream again 5s after its first failure.
const readyWithin = time.Minute

// Issue 36, item 5: a region whose upstream is not up yet starts anyway,
// not ready, saying why; its admin API, snapshot and audit work; its
// certificate service and bundle endpoint refuse handshakes rather than
// serve without a certificate. Once the upstream comes up on the address
// the region was given, the region turns ready without a restart, and
// issues workload certificates that chain to the upstream's root.
func TestRegionStartsBeforeItsUpstream(t *testing.T) {
	corpDir := t.TempDir()
	corp := baseServerOptions("corp.example", corpDir)
	corp.GRPC.Downstream.Allow = []string{"spiffe://corp.example/region/eu"}
	_, _, stopCorp := launchServer(t, corp) // creates corp's CA, then goes away
	stopCorp()
	creds := filepath.Join(t.TempDir(), "upstream")
	_, stderr, code := runCLIAt(t, time.Now, "", "ca", "issue", "--data-dir", corpDir, "--spiffe-id", "spiffe://corp.example/region/eu", "--credentials-dir", creds, "--ttl", "1h")
	require.Equal(t, 0, code, stderr)
	corpRoots := filepath.Join(creds, caclient.RootsFile)

	upstreamAddr := servertest.ReservePort(t) // nothing listens there yet
	regionDir := t.TempDir()
	region := baseServerOptions("corp.example", regionDir)
	region.Upstream = server.UpstreamConfig{Kind: server.UpstreamTrustbridge, TTL: 24 * time.Hour, Trustbridge: server.TrustbridgeUpstreamConfig{
		Address: upstreamAddr, RootCert: corpRoots, ProvCert: creds, Timeout: 10 * time.Second}}
	region.GRPC.Listen = "127.0.0.1:0"
	region.Bundle.Listen, region.Bundle.Profile = "127.0.0.1:0", server.ProfileSPIFFE
	admin, banner, _ := launchServer(t, region)
	grpcAddr, bundleURL := servertest.GRPCAddr(t, banner), servertest.EndpointURL(t, banner)

	status, body := servertest.Get(t, "http://"+admin+"/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.True(t, strings.HasPrefix(body, "not ready: upstream authority: waiting for the upstream to sign our intermediate: ca: trustbridge upstream "+upstreamAddr+": "), body)
	assert.Contains(t, body, "connection refused")
	assert.Contains(t, body, "; 1 failed requests since ")
	assert.Contains(t, body, "; next attempt in ")

	snap := servertest.GetSnapshot(t, "http://"+admin)
	require.NotNil(t, snap.CA)
	require.NotNil(t, snap.CA.Upstream)
	assert.Equal(t, 1, snap.CA.Upstream.Failures)
	assert.False(t, snap.CA.Upstream.Refused)
	assert.NotNil(t, snap.CA.Upstream.NextAttempt)
	assert.Contains(t, snap.CA.Upstream.LastError, "connection refused")
	out, stderr, code := runCLI(t, "", "audit", "--admin", "http://"+admin, "-o", "json")
	assert.Equal(t, 2, code, "a critical finding: %s", stderr)
	assert.Equal(t, map[string]api.Severity{audit.CodeNoIntermediate: api.SeverityCritical}, findingCodes(t, out))

	// No listener serves without a certificate: handshakes fail.
	for _, addr := range []string{grpcAddr, strings.TrimSuffix(strings.TrimPrefix(bundleURL, "https://"), "/")} {
		_, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) //nolint:gosec // the handshake must fail before any verification
		require.Error(t, err, addr)
		assert.ErrorContains(t, err, "internal error", addr)
	}

	// The upstream comes up where the region looks for it.
	corp.GRPC.Listen = upstreamAddr
	launchServer(t, corp)
	require.Eventually(t, func() bool {
		status, _ := servertest.Get(t, "http://"+admin+"/readyz")
		return status == http.StatusOK
	}, readyWithin, 50*time.Millisecond, "the region turns ready once its upstream signs")
	snap = servertest.GetSnapshot(t, "http://"+admin)
	assert.Zero(t, snap.CA.Upstream.Failures)
	assert.NotNil(t, snap.CA.Upstream.LastSuccess)

	// Both listeners serve now, with certificates under corp's root.
	td := spiffeid.RequireTrustDomainFromString("corp.example")
	pem, err := os.ReadFile(corpRoots)
	require.NoError(t, err)
	bundle, err := x509bundle.Parse(td, pem)
	require.NoError(t, err)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsconfig.TLSClientConfig(bundle,
		tlsconfig.AuthorizeID(spiffeid.RequireFromPath(td, "/trustbridge/bundle-endpoint")))}}
	t.Cleanup(client.CloseIdleConnections)
	resp, err := client.Get(bundleURL)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	regionCreds := filepath.Join(t.TempDir(), "region-issued")
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "issue", "--data-dir", regionDir, "--spiffe-id", "spiffe://corp.example/region/eu", "--credentials-dir", regionCreds, "--ttl", "1h")
	require.Equal(t, 0, code, stderr)
	workload := filepath.Join(t.TempDir(), "workload")
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", grpcAddr, "--root-cert", corpRoots,
		"--prov-cert", regionCreds, "--credentials-dir", workload)
	require.Equal(t, 0, code, stderr)
	chain, err := caclient.ReadPEMCerts(filepath.Join(workload, caclient.ChainFile))
	require.NoError(t, err)
	id, _, err := x509svid.Verify(chain, bundle)
	require.NoError(t, err, "the region's leaf chains to corp's root")
	assert.Equal(t, "spiffe://corp.example/region/eu", id.String())
}

// findingCodes are the codes and severities of audit -o json's findings.
func findingCodes(t *testing.T, out string) map[string]api.Severity {
	t.Helper()
	var findings []api.Finding
	require.NoError(t, json.Unmarshal([]byte(out), &findings), out)
	got := map[string]api.Severity{}
	for _, f := range findings {
		got[f.Code] = f.Severity
	}
	return got
}
