package trust_test

import (
	"crypto/x509"
	"net/url"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var (
	tdA  = spiffeid.RequireTrustDomainFromString("a.test")
	tdB  = spiffeid.RequireTrustDomainFromString("b.test")
	idA  = spiffeid.RequireFromString("spiffe://a.test/workload")
	idA2 = spiffeid.RequireFromString("spiffe://a.test/other")
	idB  = spiffeid.RequireFromString("spiffe://b.test/workload")
)

// storeWith returns a store holding each CA's bundle under source "test".
func storeWith(cas ...*testca.CA) *trust.Store {
	s := trust.NewStore()
	for _, ca := range cas {
		s.Set("test", ca.Bundle())
	}
	return s
}

func raw(certs ...*x509.Certificate) [][]byte {
	out := make([][]byte, len(certs))
	for i, c := range certs {
		out[i] = c.Raw
	}
	return out
}

func mustURL(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatalf("parse %q: %v", s, err)
	}
	return u
}
