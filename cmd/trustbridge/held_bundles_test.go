package main

import (
	"encoding/pem"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// getServed reads path from s's bundle endpoint over https_spiffe, as a
// workload of s's trust domain would.
func getServed(t *testing.T, s *e2eServer, path string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: trust.ClientTLSConfig(nil, ownVerifier(t, s))}}
	defer client.CloseIdleConnections()
	resp, err := client.Get(strings.TrimSuffix(s.bundleURL, "/") + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// A bundle set at run time (bundle set TD FILE) is held like any other:
// the bundle endpoint serves it at /bundles/TD and in /bundle-map, as the
// README promises for every bundle held; federation status lists it with
// where it comes from, and /ui does not call it a bundle file (issue 36,
// item 1).
func TestBundleSetIsServedAndListed(t *testing.T) {
	dir := t.TempDir()
	local := startE2EServer(t, "example.org", dir, nil)
	static := testca.New(t, "static.example")
	file := writeTemp(t, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: static.Cert.Raw})))
	mustCLI(t, "bundle", "set", "static.example", file, "--admin", local.admin, "--data-dir", dir)
	td := spiffeid.RequireTrustDomainFromString("static.example")

	var code int
	var body string
	require.Eventually(t, func() bool {
		code, body = getServed(t, local, "/bundles/static.example")
		return code == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond, "/bundles/static.example never served: %d %s", code, body)
	served, _, err := bundledoc.Parse(td, []byte(body))
	require.NoError(t, err)
	require.Len(t, served.X509Authorities(), 1)
	assert.True(t, served.X509Authorities()[0].Equal(static.Cert))
	inMap, ok := fetchBundleMap(t, local, trust.ClientTLSConfig(nil, ownVerifier(t, local)))[td]
	require.True(t, ok, "/bundle-map leaves the bundle set at run time out")
	assert.True(t, inMap.Equal(served))

	st, ok := federationStatus(t, local, "static.example")
	require.True(t, ok, "/v1/federation leaves the bundle set at run time out")
	assert.Equal(t, api.StateStatic, st.State)
	assert.Equal(t, api.OriginStatic, st.Origin)
	require.Len(t, st.Authorities, 1)
	assert.Equal(t, api.KindX509, st.Authorities[0].Kind)
	table := mustCLI(t, "federation", "status", "--admin", local.admin)
	assert.Regexp(t, `static\.example\s+STATIC\s+.*set at run time by bundle set`, table)

	code, page := servertest.Get(t, local.admin+"/ui")
	require.Equal(t, http.StatusOK, code)
	assert.NotContains(t, page, "1 from files", "a bundle set at run time is not a bundle file")
	assert.Contains(t, page, "1 set by bundle set")
	assert.Contains(t, page, "set at run time by trustbridge bundle set")

	// Replaced, then forgotten with the trust domain: the endpoint follows.
	other := testca.New(t, "static.example")
	mustCLI(t, "bundle", "set", "static.example", writeTemp(t, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: other.Cert.Raw}))),
		"--admin", local.admin, "--data-dir", dir)
	require.Eventually(t, func() bool {
		code, body = getServed(t, local, "/bundles/static.example")
		b, _, err := bundledoc.Parse(td, []byte(body))
		return code == http.StatusOK && err == nil && len(b.X509Authorities()) == 1 && b.X509Authorities()[0].Equal(other.Cert)
	}, 30*time.Second, 20*time.Millisecond, "the replaced bundle is never served: %d %s", code, body)
}

// A bundle file relayed with --bundle-file TD=FILE is listed by federation
// status as one, with its path.
func TestRelayedBundleFileListed(t *testing.T) {
	relayed := testca.New(t, "relayed.example")
	doc, err := bundledoc.Marshal(relayed.Bundle())
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "relayed.json")
	require.NoError(t, os.WriteFile(path, doc, 0o600))
	local := startE2EServer(t, "example.org", t.TempDir(), func(o *server.Config) { o.Bundle.Files = []string{"relayed.example=" + path} })

	st, ok := federationStatus(t, local, "relayed.example")
	require.True(t, ok, "/v1/federation leaves the relayed bundle file out")
	assert.Equal(t, api.StateStatic, st.State)
	assert.Equal(t, api.OriginBundleFile+":"+path, st.Origin)
	assert.Regexp(t, `relayed\.example\s+STATIC\s+.*bundle file `+path, mustCLI(t, "federation", "status", "--admin", local.admin))
}
