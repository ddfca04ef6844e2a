package ca

import (
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLocalRoots: the authenticator's verified-chain cache is keyed by
// the bundle pointer, so the same pointer must come back until the CA
// publishes, and a new one after.
func TestLocalRoots(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	a, err := New(Config{TrustDomain: td, DataDir: t.TempDir()})
	require.NoError(t, err)
	r := a
	b1, err := r.GetX509BundleForTrustDomain(td)
	require.NoError(t, err)
	b2, err := r.GetX509BundleForTrustDomain(td)
	require.NoError(t, err)
	assert.Same(t, b1, b2)
	require.Len(t, b1.X509Authorities(), 1)

	require.NoError(t, a.Rotate())
	b3, err := r.GetX509BundleForTrustDomain(td)
	require.NoError(t, err)
	assert.NotSame(t, b1, b3)
	assert.Len(t, b3.X509Authorities(), 2, "the prepared root is published")

	_, err = r.GetX509BundleForTrustDomain(spiffeid.RequireTrustDomainFromString("peer.example"))
	assert.Error(t, err, "federated trust domains never authenticate to our CA")
}
