package ca

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestServingCertRenewsAtHalfLife(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	a, err := New(testConfig(t, clk))
	require.NoError(t, err)
	id := spiffeid.RequireFromPath(tdExample, "/trustbridge/bundle-endpoint")
	s, err := a.ServingCert(id, time.Hour)
	require.NoError(t, err)

	first, err := s.GetCertificate(nil)
	require.NoError(t, err)
	require.Len(t, first.Certificate, 1, "leaf only: peers bring their own roots")
	assert.Equal(t, id.String(), first.Leaf.URIs[0].String())
	assert.Equal(t, first.Leaf.NotBefore.Add(first.Leaf.NotAfter.Sub(first.Leaf.NotBefore)/2), s.NextRenewal(), "renewal at half life")

	pool := x509.NewCertPool()
	for _, r := range a.Bundle().X509Authorities() {
		pool.AddCert(r)
	}
	_, err = first.Leaf.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: t0, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	require.Eventually(t, clk.HasWaiters, 5*time.Second, time.Millisecond, "Run waits for the renewal time")
	clk.SetTime(s.NextRenewal())
	require.Eventually(t, func() bool { return !s.Leaf().Equal(first.Leaf) }, 5*time.Second, time.Millisecond)
	second, _ := s.GetCertificate(nil)
	assert.NotEqual(t, first.PrivateKey, second.PrivateKey, "a fresh key each time")
	cancel()
	require.NoError(t, <-done)
}
