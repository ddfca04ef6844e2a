package trust_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"net/url"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"

	"github.com/trustbridge/trustbridge/federation/trust"
)

// A Go program embedding trustbridge verifies a peer of a federated trust
// domain: the store holds each trust domain's bundle (here the partner's,
// as the federation poller would set it), and the Verifier checks the
// peer's chain against the roots of the peer's own trust domain, then asks
// a go-spiffe authorizer whether that peer may proceed.
func ExampleVerifier() {
	partner := spiffeid.RequireTrustDomainFromString("partner.example")
	partnerRoot, partnerKey := exampleCA(partner)
	store := trust.NewStore()
	store.Set("federation:https://partner.example/bundle",
		spiffebundle.FromX509Authorities(partner, []*x509.Certificate{partnerRoot}))

	v := &trust.Verifier{Bundles: store, Authorizer: tlsconfig.AuthorizeMemberOf(partner)}
	peer := exampleLeaf(partnerRoot, partnerKey, "spiffe://partner.example/ns/billing/sa/api")
	id, err := v.VerifyPeer([][]byte{peer.Raw})
	fmt.Println(id, err)

	// The partner's CA cannot vouch for an identity of another trust
	// domain, whatever the authorizer would allow.
	forged := exampleLeaf(partnerRoot, partnerKey, "spiffe://example.org/ns/payments/sa/api")
	_, err = v.VerifyPeer([][]byte{forged.Raw})
	fmt.Println(errors.Is(err, trust.ErrUnknownDomain))

	// A member of the partner's trust domain, but not the one allowed.
	v.Authorizer = tlsconfig.AuthorizeID(spiffeid.RequireFromString("spiffe://partner.example/ns/ops/sa/api"))
	_, err = v.VerifyPeer([][]byte{peer.Raw})
	fmt.Println(errors.Is(err, trust.ErrUnauthorized))
	// Output:
	// spiffe://partner.example/ns/billing/sa/api <nil>
	// true
	// true
}

// An HTTPS client that accepts only one server of a federated trust
// domain, checked on every handshake against the store as it is then.
func ExampleClientTLSConfig() {
	store := trust.NewStore() // filled by the federation poller
	server := spiffeid.RequireFromString("spiffe://partner.example/ns/billing/sa/api")
	v := &trust.Verifier{Bundles: store, Authorizer: tlsconfig.AuthorizeID(server)}
	// getClientCert would return this workload's own X509-SVID; nil sends
	// no client certificate.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: trust.ClientTLSConfig(nil, v)}}
	_ = client
}

func exampleCA(td spiffeid.TrustDomain) (*x509.Certificate, crypto.Signer) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	return exampleSign(&x509.Certificate{
		Subject:               pkix.Name{Organization: []string{td.Name()}},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
		URIs:                  []*url.URL{td.ID().URL()},
	}, nil, key, key), key
}

func exampleLeaf(parent *x509.Certificate, parentKey crypto.Signer, id string) *x509.Certificate {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	return exampleSign(&x509.Certificate{
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{spiffeid.RequireFromString(id).URL()},
	}, parent, key, parentKey)
}

func exampleSign(tmpl, parent *x509.Certificate, key, parentKey crypto.Signer) *x509.Certificate {
	tmpl.SerialNumber, _ = rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		panic(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		panic(err)
	}
	return cert
}
