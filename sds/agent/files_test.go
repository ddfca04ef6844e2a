package agent

import (
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/pemfile"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func TestParseCredentialSet(t *testing.T) {
	caA, caB := testca.New(t, tdA.Name()), testca.New(t, tdB.Name())
	anonB := testca.New(t, tdB.Name(), testca.Options{Mutate: func(c *x509.Certificate) { c.URIs = nil }})
	leaf, key := caA.Issue(t, workload)
	ecDER, err := x509.MarshalECPrivateKey(key.(*ecdsa.PrivateKey))
	require.NoError(t, err)
	ecKey := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: ecDER})
	_, otherKey := caA.Issue(t, workload)
	roots := pemCerts(caA.Cert)
	bundleMap := bundleMapOf(t, map[spiffeid.TrustDomain][]*x509.Certificate{tdB: {caB.Cert}})

	tests := []struct {
		name      string
		chain     []byte
		key       []byte
		roots     []byte
		bundleMap []byte
		wantErr   string
	}{
		{"pkcs8", pemCerts(leaf), pemKey(t, key), roots, bundleMap, ""},
		{"sec1 key", pemCerts(leaf), ecKey, roots, bundleMap, ""},
		{"root at the end of the chain is dropped", pemCerts(leaf, caA.Cert), pemKey(t, key), roots, bundleMap, ""},
		{"empty chain", nil, pemKey(t, key), roots, bundleMap, "cert-chain.pem: no PEM certificate"},
		{"key in chain", append(pemCerts(leaf), pemKey(t, key)...), pemKey(t, key), roots, bundleMap, "not a CERTIFICATE"},
		{"leaf not an SVID", pemCerts(caB.Cert, caA.Cert), pemKey(t, key), roots, bundleMap, "cert-chain.pem: leaf"},
		{"no key", pemCerts(leaf), nil, roots, bundleMap, "key.pem: no PEM block"},
		{"two keys", pemCerts(leaf), append(pemKey(t, key), pemKey(t, otherKey)...), roots, bundleMap, "more than one"},
		{"certificate as key", pemCerts(leaf), pemCerts(leaf), roots, bundleMap, "not a private key"},
		{"leaf as root", pemCerts(leaf), pemKey(t, key), pemCerts(caA.Cert, leaf), bundleMap, "not a CA"},
		// A merged root-cert.pem, as `ca request` wrote before federated
		// trust moved to the bundle map: refused, not sorted by SAN.
		{"peer root in root-cert.pem", pemCerts(leaf), pemKey(t, key), pemCerts(caA.Cert, caB.Cert), nil, "is a root of b.test, not of a.test"},
		{"only a peer root", pemCerts(leaf), pemKey(t, key), pemCerts(caB.Cert), nil, "is a root of b.test"},
		// The same with the peer's root naming no trust domain (Istio's,
		// a Web PKI CA's): refused too, since ours names a.test.
		{"anonymous peer root in root-cert.pem", pemCerts(leaf), pemKey(t, key), pemCerts(caA.Cert, anonB.Cert), nil, "names no trust domain while certificate 0 is a root of a.test"},
		{"bundle map not a map", pemCerts(leaf), pemKey(t, key), roots, []byte(`{"keys":[]}`), "bundle.spiffe.json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, err := parseCredentialSet(tt.chain, tt.key, tt.roots, tt.bundleMap)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, workload, set.id)
			require.Len(t, set.chain, 1)
			assert.Equal(t, leaf.Raw, set.chain[0].Raw)
			assert.Equal(t, map[spiffeid.TrustDomain][]*x509.Certificate{tdA: {caA.Cert}, tdB: {caB.Cert}}, set.roots)
		})
	}
	// A mismatched key parses; the credential cell refuses it (see
	// TestRunFiles).
	_, err = parseCredentialSet(pemCerts(leaf), pemKey(t, otherKey), roots, nil)
	require.NoError(t, err)
}

// TestParseCredentialSetProvenance: a root is trusted for a trust domain
// only because it came from that trust domain's bundle. A peer's root
// without a URI SAN (Istio's, a Web PKI CA) listed under the peer in the
// bundle map stays the peer's; the bundle map's entry for the local trust
// domain cannot add roots to it (root-cert.pem is the one source).
func TestParseCredentialSetProvenance(t *testing.T) {
	caA := testca.New(t, tdA.Name())
	anonPeer := testca.New(t, tdB.Name(), testca.Options{Mutate: func(c *x509.Certificate) { c.URIs = nil }})
	leaf, key := caA.Issue(t, workload)
	doc := bundleMapOf(t, map[spiffeid.TrustDomain][]*x509.Certificate{
		tdA: {anonPeer.Cert}, // a map claiming a peer's root for us: ignored
		tdB: {anonPeer.Cert},
	})
	set, err := parseCredentialSet(pemCerts(leaf), pemKey(t, key), pemCerts(caA.Cert), doc)
	require.NoError(t, err)
	assert.Equal(t, []*x509.Certificate{caA.Cert}, set.roots[tdA], "local roots come from root-cert.pem alone")
	assert.Equal(t, []*x509.Certificate{anonPeer.Cert}, set.roots[tdB])
}

func bundleMapOf(t testing.TB, m map[spiffeid.TrustDomain][]*x509.Certificate) []byte {
	t.Helper()
	var bundles []*spiffebundle.Bundle
	for td, roots := range m {
		bundles = append(bundles, spiffebundle.FromX509Authorities(td, roots))
	}
	doc, err := bundledoc.MarshalMap(bundles)
	require.NoError(t, err)
	return doc
}

func FuzzParseCredentialSet(f *testing.F) {
	ca := testca.New(f, tdA.Name())
	leaf, key := ca.Issue(f, workload)
	peer := testca.New(f, tdB.Name())
	doc := bundleMapOf(f, map[spiffeid.TrustDomain][]*x509.Certificate{tdB: {peer.Cert}})
	f.Add(pemCerts(leaf), pemKey(f, key), pemCerts(ca.Cert), doc)
	f.Add(pemCerts(leaf, ca.Cert), pemKey(f, key), pemCerts(ca.Cert, leaf), []byte(nil))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"), []byte{}, []byte("x"), []byte("{}"))
	f.Fuzz(func(t *testing.T, chain, key, roots, bundleMap []byte) {
		set, err := parseCredentialSet(chain, key, roots, bundleMap)
		if err != nil {
			return
		}
		if set.id.IsZero() || len(set.chain) == 0 || set.key == nil || len(set.roots[set.id.TrustDomain()]) == 0 {
			t.Fatalf("accepted an incomplete set: %+v", set)
		}
		// Whatever the map says, the local roots are root-cert.pem's.
		local, err := pemfile.ParseCertificates(roots)
		if err != nil || len(local) != len(set.roots[set.id.TrustDomain()]) {
			t.Fatalf("local roots not from root-cert.pem: %v", err)
		}
	})
}
