// Package catest helps tests outside package ca drive a ca.Authority: an
// upstream authority that signs intermediates with a test root on a
// given clock and fails on demand, and a check that the Authority signs
// workload certificates its own bundle verifies.
package catest

import (
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// SignLeaf has a sign an X509-SVID for id and checks it with go-spiffe at
// now against a's published bundle, as a peer would: through every
// intermediate in the chain, to a root in the bundle. It returns what a
// issued.
func SignLeaf(tb testing.TB, a *ca.Authority, id spiffeid.ID, now time.Time) *ca.Issued {
	tb.Helper()
	issued, err := a.SignX509SVID(ca.X509SVIDParams{PublicKey: testca.NewKey(tb, testca.ECP256).Public(), SPIFFEID: id})
	require.NoError(tb, err)
	raw := make([][]byte, 0, len(issued.Chain))
	for _, c := range issued.Chain[:len(issued.Chain)-len(issued.Roots)] {
		raw = append(raw, c.Raw)
	}
	got, _, err := x509svid.ParseAndVerify(raw, x509bundle.FromX509Authorities(id.TrustDomain(), a.Bundle().X509Authorities()), x509svid.WithTime(now))
	require.NoError(tb, err)
	require.Equal(tb, id, got)
	return issued
}
