package trust_test

import (
	"crypto/x509"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/testca"
)

func TestMergedRoots(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	local := testca.New(t, "example.org", testca.Options{})
	b := testca.New(t, "b.example", testca.Options{})
	a := testca.New(t, "a.example", testca.Options{})
	store := trust.NewStore()
	roots := store.MergedRoots(td)
	assert.Empty(t, roots())

	store.Set("peer", b.Bundle())
	store.Set("ca", local.Bundle())
	store.Set("peer", a.Bundle())
	got := roots()
	assert.Equal(t, []*x509.Certificate{local.Cert, a.Cert, b.Cert}, got, "local first, then by trust domain name")
	assert.Same(t, &got[0], &roots()[0], "reused until the store changes")

	// A second source for a.example adds its root after a's first.
	a2 := testca.New(t, "a.example", testca.Options{})
	store.Set("file:a2", spiffebundle.FromX509Authorities(a.TrustDomain, []*x509.Certificate{a2.Cert}))
	got = roots()
	require.Len(t, got, 4)
	assert.Equal(t, local.Cert, got[0])
	assert.ElementsMatch(t, []*x509.Certificate{a.Cert, a2.Cert}, got[1:3])
	assert.Equal(t, b.Cert, got[3])

	// A federated bundle holding a root that names another trust domain,
	// ours above all: a client that tells roots apart by their URI SAN
	// (ca request) would take it for one of ours. It is left out; roots
	// naming no trust domain (plug-in CAs) stay.
	forged := testca.New(t, "example.org")
	plain := testca.New(t, "evil.example", testca.Options{Mutate: func(c *x509.Certificate) { c.URIs = nil }})
	store.Set("peer-evil", spiffebundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString("evil.example"),
		[]*x509.Certificate{forged.Cert, plain.Cert, b.Cert}))
	got = roots()
	require.Len(t, got, 5, "local, a, a2, b, then evil.example's plain root only")
	assert.Equal(t, []*x509.Certificate{b.Cert, plain.Cert}, got[3:])
	for _, r := range got {
		assert.NotSame(t, forged.Cert, r, "a peer's root naming our trust domain")
	}
}
