package svidcheck

import (
	"crypto/x509"
	"net/url"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func TestTrustDomain(t *testing.T) {
	named := testca.New(t, "example.org").Cert
	tests := []struct {
		name   string
		mutate func(*x509.Certificate)
		td     string
	}{
		{"spiffe://td", nil, "example.org"},
		{"no URI", func(c *x509.Certificate) { c.URIs = nil }, ""},
		{"a path", func(c *x509.Certificate) {
			c.URIs = []*url.URL{spiffeid.RequireFromString("spiffe://example.org/vm/laptop").URL()}
		}, ""},
		{"two URIs", func(c *x509.Certificate) { c.URIs = append(c.URIs, c.URIs[0]) }, ""},
		{"not spiffe", func(c *x509.Certificate) { c.URIs = []*url.URL{{Scheme: "https", Host: "example.org"}} }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := *named
			c.URIs = append([]*url.URL(nil), named.URIs...)
			if tt.mutate != nil {
				tt.mutate(&c)
			}
			td, ok := RootTrustDomain(&c)
			assert.Equal(t, tt.td != "", ok)
			if ok {
				assert.Equal(t, tt.td, td.Name())
			}
		})
	}
}

func TestTrustDomains(t *testing.T) {
	a := testca.New(t, "a.example").Cert
	a2 := testca.New(t, "a.example").Cert
	b := testca.New(t, "b.example").Cert
	plain := testca.New(t, "c.example", testca.Options{Mutate: func(c *x509.Certificate) { c.URIs = nil }}).Cert

	named, anonymous := RootTrustDomains([]*x509.Certificate{b, a, a2})
	assert.Equal(t, []string{"b.example", "a.example"}, names(named), "in order of first appearance, once each")
	assert.False(t, anonymous)

	named, anonymous = RootTrustDomains([]*x509.Certificate{plain, a})
	assert.Equal(t, []string{"a.example"}, names(named))
	assert.True(t, anonymous, "a root naming no trust domain")

	named, anonymous = RootTrustDomains(nil)
	assert.Empty(t, named)
	assert.False(t, anonymous)
}

func names(tds []spiffeid.TrustDomain) []string {
	var out []string
	for _, td := range tds {
		out = append(out, td.Name())
	}
	return out
}

func TestNamesOnly(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("peer.example")
	tests := []struct {
		name string
		uris []string
		want bool
	}{
		{"no URI", nil, true},
		{"spiffe://td", []string{"spiffe://peer.example"}, true},
		{"td with a path", []string{"spiffe://peer.example/ca"}, true},
		{"td twice", []string{"spiffe://peer.example", "spiffe://peer.example/ca"}, true},
		{"not spiffe", []string{"https://example.org"}, true},
		{"another td", []string{"spiffe://example.org"}, false},
		{"another td with a path", []string{"spiffe://example.org/x"}, false},
		{"td and another", []string{"spiffe://peer.example", "spiffe://example.org"}, false},
		{"unparsable spiffe URI", []string{"spiffe://EXAMPLE.org"}, false},
		{"upper-case scheme", []string{"SPIFFE://example.org"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &x509.Certificate{}
			for _, s := range tt.uris {
				u, err := url.Parse(s)
				if err != nil {
					t.Fatal(err)
				}
				c.URIs = append(c.URIs, u)
			}
			assert.Equal(t, tt.want, RootNamesOnly(c, td))
		})
	}
}
