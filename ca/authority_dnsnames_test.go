package ca

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestAuthoritySignWithDNSNames: the Authority passes the names through,
// counts the signing, and counts a refused name as a server fault.
func TestAuthoritySignWithDNSNames(t *testing.T) {
	a, err := New(testConfig(t, clocktesting.NewFakeClock(t0)))
	require.NoError(t, err)
	id := spiffeid.RequireFromPath(tdExample, "/ns/prod/sa/web")

	res, err := a.SignWithDNSNames(workloadCSR(t, id), id, 0, []string{"web.prod.svc"})
	require.NoError(t, err)
	assert.Equal(t, []string{"web.prod.svc"}, res.Leaf.DNSNames)
	assert.Equal(t, id.String(), res.Leaf.URIs[0].String())
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.signings.WithLabelValues("ok")))

	_, err = a.SignWithDNSNames(workloadCSR(t, id), id, 0, []string{"*.prod.svc"})
	require.ErrorContains(t, err, "wildcards are not issued")
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.signings.WithLabelValues("error")))

	res, err = a.Sign(workloadCSR(t, id), id, 0)
	require.NoError(t, err)
	assert.Empty(t, res.Leaf.DNSNames, "Sign adds none")
}
