package server

import (
	"crypto/x509"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

func viewOf(snap api.Snapshot, td string) (api.TrustDomain, bool) {
	for _, v := range snap.TrustDomains {
		if v.Name == td {
			return v, true
		}
	}
	return api.TrustDomain{}, false
}

// Two servers federated both ways: each snapshot names its own trust
// domain first, with the CA's roots and their state, then the peer's, with
// where it is fetched from, how, and the roots as they were fetched.
func TestSnapshotAndStatusPage(t *testing.T) {
	east, west := startSPIFFEPair(t, nil, nil)
	waitFederated(t, west, "east.example", 1, 30*time.Second)

	snap := servertest.GetSnapshot(t, west.admin)
	host, _ := os.Hostname()
	assert.Equal(t, "west.example", snap.TrustDomain)
	assert.Equal(t, host, snap.Actor)
	assert.True(t, snap.Leader)
	require.Len(t, snap.TrustDomains, 2)
	local := snap.TrustDomains[0]
	assert.Equal(t, "west.example", local.Name)
	assert.True(t, local.Local)
	assert.Equal(t, []string{"ca"}, local.Sources)
	require.Len(t, x509Viewed(local.Authorities), 1)
	assert.Equal(t, "active", x509Viewed(local.Authorities)[0].State)
	assert.NotNil(t, x509Viewed(local.Authorities)[0].Since)

	peer, ok := viewOf(snap, "east.example")
	require.True(t, ok)
	assert.False(t, peer.Local)
	require.NotNil(t, peer.Federation)
	assert.Equal(t, "ok", peer.Federation.State)
	assert.Equal(t, "https_spiffe", peer.Federation.Profile)
	assert.Equal(t, "file", peer.Federation.Origin)
	assert.Equal(t, east.bundleURL, peer.Federation.EndpointURL)
	roots := caRootsOf(t, east)
	peerRoots := x509Viewed(peer.Authorities)
	require.Len(t, peerRoots, len(roots))
	cert, err := x509.ParseCertificate(peerRoots[0].Certificate)
	require.NoError(t, err)
	assert.True(t, cert.Equal(roots[0]), "the certificate as fetched")
	assert.True(t, peerRoots[0].IsCA)
	assert.Equal(t, "ECDSA", peerRoots[0].PublicKeyAlgorithm)
	assert.Equal(t, 256, peerRoots[0].KeyBits)

	resp, err := http.Get(west.admin + "/ui")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'none'")
	code, body := servertest.Get(t, west.admin+"/ui")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "east.example")
	assert.Contains(t, body, "<svg")
	assert.False(t, strings.Contains(body, "<script"), "no scripts")
}
