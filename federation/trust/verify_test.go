package trust_test

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func TestVerifyPeerAccepts(t *testing.T) {
	caA, caB := testca.New(t, "a.test"), testca.New(t, "b.test")
	store := storeWith(caA, caB)
	v := &trust.Verifier{Bundles: store, Authorizer: tlsconfig.AuthorizeAny()}

	leafA, _ := caA.Issue(t, idA)
	id, err := v.VerifyPeer(raw(leafA))
	require.NoError(t, err)
	assert.Equal(t, idA, id)

	leafB, _ := caB.Issue(t, idB)
	id, err = v.VerifyPeer(raw(leafB))
	require.NoError(t, err)
	assert.Equal(t, idB, id)

	// An intermediate CA sent along by the peer completes the chain.
	interKey := testca.NewKey(t, testca.ECP256)
	interCert := testca.Sign(t, &x509.Certificate{
		SerialNumber:          caA.Cert.SerialNumber, // reused on purpose: a different issuer, so no clash
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
		URIs:                  []*url.URL{tdA.ID().URL()},
	}, caA.Cert, interKey.Public(), caA.Key)
	inter := &testca.CA{TrustDomain: tdA, Cert: interCert, Key: interKey}
	leaf, _ := inter.Issue(t, idA2)
	id, err = v.VerifyPeer(raw(leaf, interCert))
	require.NoError(t, err)
	assert.Equal(t, idA2, id)
	_, err = v.VerifyPeer(raw(leaf))
	assert.ErrorIs(t, err, trust.ErrChain, "without the intermediate")
}

func TestVerifyPeerRejects(t *testing.T) {
	caA, caB := testca.New(t, "a.test"), testca.New(t, "b.test")
	caC := testca.New(t, "c.test") // not in the store
	store := storeWith(caA, caB)

	issue := func(ca *testca.CA, id spiffeid.ID, mutate func(*x509.Certificate)) [][]byte {
		leaf, _ := ca.Issue(t, id, testca.Options{Mutate: mutate})
		return raw(leaf)
	}
	setURIs := func(uris ...string) func(*x509.Certificate) {
		return func(c *x509.Certificate) {
			c.URIs = nil
			for _, u := range uris {
				c.URIs = append(c.URIs, mustURL(t, u))
			}
		}
	}
	// rawSAN writes the URI SAN bytes itself: crypto/x509 would
	// re-serialize a url.URL and normalize what this test needs verbatim.
	rawSAN := func(uri string) func(*x509.Certificate) {
		return func(c *x509.Certificate) {
			c.URIs = nil
			val, err := asn1.Marshal([]asn1.RawValue{{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte(uri)}})
			require.NoError(t, err)
			c.ExtraExtensions = append(c.ExtraExtensions, pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: val})
		}
	}
	past := time.Now().Add(-48 * time.Hour)

	tests := []struct {
		name  string
		chain [][]byte
		auth  tlsconfig.Authorizer
		want  error
	}{
		{"CA leaf", issue(caA, idA, func(c *x509.Certificate) { c.IsCA = true }), nil, trust.ErrNotSVID},
		{"keyCertSign leaf", issue(caA, idA, func(c *x509.Certificate) { c.KeyUsage |= x509.KeyUsageCertSign }), nil, trust.ErrNotSVID},
		{"cRLSign leaf", issue(caA, idA, func(c *x509.Certificate) { c.KeyUsage |= x509.KeyUsageCRLSign }), nil, trust.ErrNotSVID},
		{"zero URI SANs", issue(caA, idA, setURIs()), nil, trust.ErrNotSVID},
		{"two URI SANs", issue(caA, idA, setURIs("spiffe://a.test/workload", "spiffe://a.test/other")), nil, trust.ErrNotSVID},
		{"two URI SANs, second not spiffe", issue(caA, idA, setURIs("spiffe://a.test/workload", "https://a.test/x")), nil, trust.ErrNotSVID},
		{"https scheme", issue(caA, idA, setURIs("https://a.test/workload")), nil, trust.ErrNotSVID},
		{"uppercase scheme", issue(caA, idA, rawSAN("SPIFFE://a.test/workload")), nil, trust.ErrNotSVID},
		{"uppercase scheme, written by hand", issue(caA, idA, rawSAN("Spiffe://a.test/workload")), nil, trust.ErrNotSVID},
		{"raw SAN control", issue(caA, idA, rawSAN("spiffe://a.test/workload")), tlsconfig.AuthorizeID(idA2), trust.ErrUnauthorized},
		{"uppercase host", issue(caA, idA, setURIs("spiffe://A.test/workload")), nil, trust.ErrNotSVID},
		{"trailing slash", issue(caA, idA, setURIs("spiffe://a.test/workload/")), nil, trust.ErrNotSVID},
		{"percent-encoded path", issue(caA, idA, setURIs("spiffe://a.test/w%6Frkload")), nil, trust.ErrNotSVID},
		{"dot segment", issue(caA, idA, setURIs("spiffe://a.test/x/../workload")), nil, trust.ErrNotSVID},
		{"port", issue(caA, idA, setURIs("spiffe://a.test:443/workload")), nil, trust.ErrNotSVID},
		{"query", issue(caA, idA, setURIs("spiffe://a.test/workload?x=1")), nil, trust.ErrNotSVID},
		{"trust domain ID as leaf", issue(caA, idA, setURIs("spiffe://a.test")), nil, trust.ErrNotSVID},
		{"trust domain not in store", issue(caC, spiffeid.RequireFromString("spiffe://c.test/w"), nil), nil, trust.ErrUnknownDomain},
		{"td A leaf signed by td B root, both in store", issue(caB, idA, nil), nil, trust.ErrChain},
		{"td B leaf signed by td A root, both in store", issue(caA, idB, nil), nil, trust.ErrChain},
		{"expired", issue(caA, idA, func(c *x509.Certificate) { c.NotBefore, c.NotAfter = past, past.Add(time.Hour) }), nil, trust.ErrChain},
		{"not DER", [][]byte{{0x30, 0x01}}, nil, trust.ErrNotSVID},
		{"empty chain", nil, nil, trust.ErrNoPeerCertChain},
		{"nil authorizer", issue(caA, idA, nil), tlsconfig.Authorizer(nil), trust.ErrUnauthorized},
		{"authorizer refuses", issue(caA, idA, nil), tlsconfig.AuthorizeID(idA2), trust.ErrUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			auth := tt.auth
			if auth == nil && !errors.Is(tt.want, trust.ErrUnauthorized) {
				auth = tlsconfig.AuthorizeAny()
			}
			v := &trust.Verifier{Bundles: store, Authorizer: auth}
			_, err := v.VerifyPeer(tt.chain)
			require.Error(t, err)
			assert.ErrorIs(t, err, tt.want)
			assert.Regexp(t, "^trust: ", err.Error())
		})
	}
}

func TestVerifyCertificatesKeyUsage(t *testing.T) {
	caA := testca.New(t, "a.test")
	v := &trust.Verifier{Bundles: storeWith(caA), Authorizer: tlsconfig.AuthorizeAny()}
	serverOnly, _ := caA.Issue(t, idA, testca.Options{Mutate: func(c *x509.Certificate) {
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}})
	_, err := v.VerifyCertificates([]*x509.Certificate{serverOnly}, x509.ExtKeyUsageServerAuth)
	assert.NoError(t, err)
	_, err = v.VerifyCertificates([]*x509.Certificate{serverOnly}, x509.ExtKeyUsageClientAuth)
	assert.ErrorIs(t, err, trust.ErrChain)
	_, err = v.VerifyPeer(raw(serverOnly))
	assert.NoError(t, err, "VerifyPeer accepts any usage")
}

func TestVerifierNow(t *testing.T) {
	caA := testca.New(t, "a.test")
	leaf, _ := caA.Issue(t, idA)
	v := &trust.Verifier{Bundles: storeWith(caA), Authorizer: tlsconfig.AuthorizeAny(),
		Now: func() time.Time { return leaf.NotAfter.Add(time.Second) }}
	_, err := v.VerifyPeer(raw(leaf))
	assert.ErrorIs(t, err, trust.ErrChain)
}

// A peer of trust domain B whose chain leads to A's roots is refused,
// whichever source the roots come from and however the chain is built:
// only B's own roots may vouch for a B identity, even when A is trusted
// too and the authorizer would accept any member of B.
func TestVerifyPeerOfOtherDomainUnderOurRoots(t *testing.T) {
	caA, caB := testca.New(t, "a.test"), testca.New(t, "b.test")
	direct, _ := caA.Issue(t, idB)
	// An intermediate A signed, naming B's trust domain.
	interKey := testca.NewKey(t, testca.ECP256)
	interCert := testca.Sign(t, &x509.Certificate{
		SerialNumber:          caA.Cert.SerialNumber,
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
		URIs:                  []*url.URL{tdB.ID().URL()},
	}, caA.Cert, interKey.Public(), caA.Key)
	viaInter, _ := (&testca.CA{TrustDomain: tdB, Cert: interCert, Key: interKey}).Issue(t, idB)

	bundleA := x509bundle.FromX509Authorities(tdA, []*x509.Certificate{caA.Cert})
	sources := map[string]struct {
		src  x509bundle.Source
		want error
	}{
		"store holding A and B": {storeWith(caA, caB), trust.ErrChain},
		"set holding A and B":   {x509bundle.NewSet(bundleA, x509bundle.FromX509Authorities(tdB, []*x509.Certificate{caB.Cert})), trust.ErrChain},
		"A's bundle alone":      {bundleA, trust.ErrUnknownDomain},
		"store holding A alone": {storeWith(caA), trust.ErrUnknownDomain},
	}
	chains := map[string][][]byte{
		"leaf signed by A's root":       raw(direct),
		"leaf via an intermediate of A": raw(viaInter, interCert),
	}
	for sname, s := range sources {
		for cname, chain := range chains {
			t.Run(sname+"/"+cname, func(t *testing.T) {
				v := &trust.Verifier{Bundles: s.src, Authorizer: tlsconfig.AuthorizeMemberOf(tdB)}
				id, err := v.VerifyPeer(chain)
				assert.ErrorIs(t, err, s.want)
				assert.Equal(t, idB, id, "named in the error, never authenticated")
			})
		}
	}
}

// The Verifier hands the authorizer the chains it verified, as go-spiffe's
// tlsconfig does, so an authorizer may look at them.
func TestVerifierAuthorizerSeesChains(t *testing.T) {
	caA := testca.New(t, "a.test")
	leaf, _ := caA.Issue(t, idA)
	var seen [][]*x509.Certificate
	v := &trust.Verifier{Bundles: storeWith(caA), Authorizer: func(id spiffeid.ID, chains [][]*x509.Certificate) error {
		seen = chains
		return nil
	}}
	_, err := v.VerifyPeer(raw(leaf))
	require.NoError(t, err)
	require.Len(t, seen, 1)
	assert.Equal(t, []*x509.Certificate{leaf, caA.Cert}, seen[0])
}

func TestVerifierWithoutBundles(t *testing.T) {
	caA := testca.New(t, "a.test")
	leaf, _ := caA.Issue(t, idA)
	_, err := (&trust.Verifier{Authorizer: tlsconfig.AuthorizeAny()}).VerifyPeer(raw(leaf))
	assert.ErrorContains(t, err, "no bundle source")
	_, err = (*trust.Verifier)(nil).VerifyPeer(raw(leaf))
	assert.Error(t, err)
}
