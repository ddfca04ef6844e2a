package certservice

import (
	"crypto/x509"
	"net/url"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// TestMergedRootsDropsClaimsOnOtherTrustDomains: a root peer.example
// publishes stays in the merged list only if none of its URI SANs is a
// SPIFFE ID of another trust domain, whatever else it carries: a client
// telling roots apart by any of them could file it under ours.
func TestMergedRootsDropsClaimsOnOtherTrustDomains(t *testing.T) {
	local := testca.New(t, "example.org")
	uris := func(ids ...string) func(*x509.Certificate) {
		return func(c *x509.Certificate) {
			c.URIs = nil
			for _, id := range ids {
				u, err := url.Parse(id)
				if err != nil {
					t.Fatal(err)
				}
				c.URIs = append(c.URIs, u)
			}
		}
	}
	tests := []struct {
		name string
		uris []string
		kept bool
	}{
		{"its own trust domain", []string{"spiffe://peer.example"}, true},
		{"no URI (a plug-in CA's)", nil, true},
		{"not a SPIFFE ID", []string{"https://peer.example/ca"}, true},
		{"its own trust domain twice, one with a path", []string{"spiffe://peer.example", "spiffe://peer.example/ca"}, true},
		{"ours", []string{"spiffe://example.org"}, false},
		{"a third trust domain", []string{"spiffe://third.example"}, false},
		{"ours and its own", []string{"spiffe://example.org", "spiffe://peer.example"}, false},
		{"its own and ours", []string{"spiffe://peer.example", "spiffe://example.org"}, false},
		{"ours with a path", []string{"spiffe://example.org/x"}, false},
		{"ours, not a SPIFFE ID as go-spiffe parses it", []string{"spiffe://EXAMPLE.org"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := testca.New(t, "peer.example", testca.Options{Mutate: uris(tt.uris...)}).Cert
			peer := spiffebundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString("peer.example"), []*x509.Certificate{root})
			got := mergedRoots(local.TrustDomain, []*spiffebundle.Bundle{local.Bundle(), peer}, trustpolicy.Decision{})
			want := []*x509.Certificate{local.Cert}
			if tt.kept {
				want = append(want, root)
			}
			assert.Equal(t, want, got)
		})
	}
}
