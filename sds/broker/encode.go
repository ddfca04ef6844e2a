package broker

import (
	"crypto/x509"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	wapi "github.com/trustbridge/trustbridge/sds/workload"
)

// ownBundle is the X.509 authorities of the State's SVID's trust domain,
// ASN.1 DER concatenated.
func ownBundle(st *wapi.State) []byte {
	for _, b := range st.Bundles {
		if b.TrustDomain() == st.SVID.ID.TrustDomain() {
			return concatDER(b.X509Authorities())
		}
	}
	return nil
}

// x509Bundles is every trust domain of the State with X.509 authorities
// but except, keyed by its SPIFFE ID ("spiffe://<td>"), ASN.1 DER
// concatenated.
func x509Bundles(st *wapi.State, except spiffeid.TrustDomain) map[string][]byte {
	out := make(map[string][]byte, len(st.Bundles))
	for _, b := range st.Bundles {
		if b.TrustDomain() != except && len(b.X509Authorities()) > 0 {
			out[b.TrustDomain().IDString()] = concatDER(b.X509Authorities())
		}
	}
	return out
}

// jwtBundles is every trust domain of the State with JWT authorities, as
// a JWKS document keyed by its SPIFFE ID; keys sorted by key ID, so that
// equal States make equal messages.
func jwtBundles(st *wapi.State) (map[string][]byte, error) {
	out := make(map[string][]byte, len(st.Bundles))
	for _, b := range st.Bundles {
		if len(b.JWTAuthorities()) == 0 {
			continue
		}
		doc, err := bundledoc.MarshalJWKS(b.JWTAuthorities())
		if err != nil {
			return nil, fmt.Errorf("broker: trust domain %q: %w", b.TrustDomain().Name(), err)
		}
		out[b.TrustDomain().IDString()] = doc
	}
	return out, nil
}

func concatDER(certs []*x509.Certificate) []byte {
	n := 0
	for _, c := range certs {
		n += len(c.Raw)
	}
	out := make([]byte, 0, n)
	for _, c := range certs {
		out = append(out, c.Raw...)
	}
	return out
}

// noTrustDomain excepts none from x509Bundles.
var noTrustDomain spiffeid.TrustDomain
