package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/spiretest"
)

// TestSPIREAcceptsRestoredBundle is issue 21's drill against a real SPIRE
// server (v1.13.3) federated with east over https_spiffe: back up, rotate
// twice, restore the backup, restart. SPIRE takes every bundle east
// publishes, and after the restore holds exactly the restored root.
//
// SPIRE 1.13.3's bundle client ignores spiffe_sequence: its decoder
// (pkg/common/bundleutil.Decode) keeps the keys and the refresh hint only,
// and the updater stores any fetched bundle that differs from the held
// one. So SPIRE never refused a restored bundle as a regression; it took
// the older keys at once. What it needs from trustbridge is that every
// fetch succeeds and carries the keys east serves, which the test checks
// at every step, through `spire-server federation refresh` and `bundle
// list`.
func TestSPIREAcceptsRestoredBundle(t *testing.T) {
	if testing.Short() {
		t.Skip("runs spire-server and waits for two root activations")
	}
	d := newRestoreDrill(t)
	spire := spiretest.Start(t, spiretest.Config{TrustDomain: "spire.example", Federates: []spiretest.Federation{{
		TrustDomain: "east.example", URL: "https://" + d.addr + "/", EndpointSPIFFEID: "spiffe://east.example/trustbridge/bundle-endpoint",
	}}})
	doc, err := bundledoc.Marshal(servertest.SPIFFEBundle(t, "east.example", d.roots...))
	require.NoError(t, err)
	spire.SetBundle(t, "east.example", doc)

	// waitHolds has SPIRE refresh east's bundle until it holds the roots
	// east serves now (a refresh may land while east restarts).
	waitHolds := func(roots int) {
		t.Helper()
		served := servedRoots(t, d.east)
		require.Len(t, served, roots)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			b, err := spire.Refresh("east.example")
			if !assert.NoError(c, err) {
				return
			}
			assert.ElementsMatch(c, served, b.X509Authorities)
		}, 60*time.Second, 200*time.Millisecond, "SPIRE holds east's %d roots", roots)
	}
	waitHolds(1)

	archive := d.backup()
	d.rotate()
	waitHolds(2)
	d.rotate()
	waitHolds(3)
	before := d.highest()

	d.restore(archive)
	assert.Greater(t, d.published[len(d.published)-1], before, "published sequences: %v", d.published)
	waitHolds(1)
	held, err := spire.FederatedBundle("east.example")
	require.NoError(t, err)
	require.Len(t, held.X509Authorities, 1)
	assert.True(t, bytes.Equal(d.roots[0].Raw, held.X509Authorities[0]), "SPIRE trusts the restored root")
}

// servedRoots is the DER of every X.509 authority s publishes.
func servedRoots(t *testing.T, s *e2eServer) [][]byte {
	t.Helper()
	b, ok := fetchBundleMap(t, s, trust.ClientTLSConfig(nil, ownVerifier(t, s)))[s.td]
	require.True(t, ok)
	var out [][]byte
	for _, c := range b.X509Authorities() {
		out = append(out, c.Raw)
	}
	return out
}
