package federation

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// The https_spiffe server is authenticated by trust.Verifier, so what it
// refuses and go-spiffe's x509svid.Verify alone would accept is refused
// at the bundle endpoint too: a URI SAN that only becomes the endpoint ID
// once crypto/x509 has normalized it, and a certificate not meant for a
// TLS server.
func TestFetchSPIFFEUsesTrustVerifier(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	rawSAN := func(uri string) func(*x509.Certificate) {
		return func(c *x509.Certificate) {
			c.URIs = nil
			val, err := asn1.Marshal([]asn1.RawValue{{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte(uri)}})
			require.NoError(t, err)
			c.ExtraExtensions = append(c.ExtraExtensions, pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: val})
		}
	}
	tests := []struct {
		name    string
		mutate  func(*x509.Certificate)
		want    error
		wantMsg string
	}{
		{name: "uppercase scheme in the URI SAN", mutate: rawSAN("SPIFFE://example.org/bundle-server"), want: trust.ErrNotSVID, wantMsg: "not an X509-SVID"},
		{name: "client-only extended key usage", mutate: func(c *x509.Certificate) {
			c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		}, want: trust.ErrChain, wantMsg: "serverAuth"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cert := svidCert(t, fx.ca, fetchServerID, testca.Options{Mutate: tt.mutate})
			// Control: go-spiffe alone takes it for the endpoint's SVID.
			id, _, err := x509svid.Verify([]*x509.Certificate{cert.Leaf},
				x509bundle.FromX509Authorities(fx.ca.TrustDomain, []*x509.Certificate{fx.ca.Cert}))
			require.NoError(t, err)
			require.Equal(t, fetchServerID, id.String())

			srv := startTLS(t, serveDoc(fx.doc), &cert)
			res, err := fx.fetcher(FetcherConfig{AllowPrivate: true}).Fetch(t.Context(), spiffeEndpoint(t, srv.URL), "")
			require.Error(t, err)
			assert.Nil(t, res)
			assert.ErrorIs(t, err, ErrTLS)
			assert.ErrorIs(t, err, tt.want)
			assert.Equal(t, "tls", FetchErrorKind(err))
			assert.Contains(t, err.Error(), tt.wantMsg)
		})
	}
}
