package distribution

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

const testSigner = "trustbridge.io/svid"

func TestRenderTrustBundlesOnePerTrustDomain(t *testing.T) {
	store, cas := newStore(t, "peer.example", "other.example")
	want, skips := renderTrustBundles(store.Snapshot(), testSigner)
	assert.Empty(t, skips)
	require.Len(t, want, 3)
	for td, ca := range cas {
		name := "trustbridge.io:svid:" + td
		w, ok := want[name]
		require.True(t, ok, "no bundle named %s", name)
		assert.Equal(t, td, w.trustDomain)
		assert.Equal(t, map[string]string{ManagedByLabel: ManagedByValue, TrustDomainLabel: td}, w.labels)
		roots := parsePEM(t, w.pem)
		require.Len(t, roots, 1, "a trust domain's bundle holds its own roots only")
		assert.True(t, roots[0].Equal(ca.Cert))
	}
}

func TestRenderTrustBundleLeavesOutWhatTheAPIServerRefuses(t *testing.T) {
	ca := testca.New(t, "peer.example")
	leaf, _ := ca.Issue(t, spiffeid.RequireFromString("spiffe://peer.example/w"))
	td := spiffeid.RequireTrustDomainFromString("peer.example")

	w, skip := renderTrustBundle(td, []*x509.Certificate{ca.Cert, leaf, ca.Cert}, testSigner)
	require.Nil(t, skip)
	roots := parsePEM(t, w.pem)
	require.Len(t, roots, 1, "the duplicate and the non-CA certificate are left out")
	assert.Equal(t, 1, w.dropped)

	_, skip = renderTrustBundle(td, []*x509.Certificate{leaf}, testSigner)
	require.NotNil(t, skip)
	assert.Equal(t, reasonNoCAAuthorities, skip.reason)
	assert.Contains(t, skip.err.Error(), "none of its 1 X.509 authorities is a CA certificate")
}

func TestRenderTrustBundleOverOneMiB(t *testing.T) {
	key := testca.NewKey(t, testca.ECP256)
	var roots []*x509.Certificate
	size := 0
	for i := 0; size <= maxTrustBundleBytes; i++ {
		tmpl := &x509.Certificate{
			Subject:   pkix.Name{CommonName: "root " + strings.Repeat("x", 200), SerialNumber: time.Now().String()},
			NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		}
		c := testca.Sign(t, tmpl, tmpl, key.Public(), key)
		roots = append(roots, c)
		size += len(c.Raw) * 4 / 3
	}
	_, skip := renderTrustBundle(spiffeid.RequireTrustDomainFromString("big.example"), roots, testSigner)
	require.NotNil(t, skip)
	assert.Equal(t, reasonTooLarge, skip.reason)
	assert.Contains(t, skip.err.Error(), "over the ClusterTrustBundle limit of 1048576")
}

func TestTrustBundleName(t *testing.T) {
	for td, want := range map[string]string{
		"example.org":      "trustbridge.io:svid:example.org",
		"a-b.example":      "trustbridge.io:svid:a-b.example",
		"under_score.org":  "trustbridge.io:svid:td-",
		"-leading.example": "trustbridge.io:svid:td-",
	} {
		got := trustBundleName(testSigner, spiffeid.RequireTrustDomainFromString(td))
		assert.True(t, strings.HasPrefix(got, want), "%s: %s", td, got)
	}
	a := trustBundleName(testSigner, spiffeid.RequireTrustDomainFromString("a_b.org"))
	b := trustBundleName(testSigner, spiffeid.RequireTrustDomainFromString("a__b.org"))
	assert.NotEqual(t, a, b, "hashed names must not collide")
}

func TestCheckSignerName(t *testing.T) {
	for _, ok := range []string{"trustbridge.io/svid", "example.com/pod.identity", "a.b.c/x"} {
		assert.NoError(t, CheckSignerName(ok), ok)
	}
	for bad, msg := range map[string]string{
		"":                    "want DOMAIN/PATH",
		"trustbridge.io":      "want DOMAIN/PATH",
		"trustbridge.io/a/b":  "want DOMAIN/PATH",
		"localhost/svid":      "at least two labels",
		"Trustbridge.io/svid": "must be a DNS name",
		"trustbridge.io/Svid": "path",
		"trustbridge.io/":     "path",
	} {
		err := CheckSignerName(bad)
		if assert.Error(t, err, bad) {
			assert.Contains(t, err.Error(), msg, bad)
		}
	}
}

// A trust domain named like another's hashed name cannot take its
// bundle: no trust domain's name is another's hash, and were two names
// ever equal, neither would get a bundle.
func TestRenderTrustBundlesNameCollision(t *testing.T) {
	hashed := trustBundleName(testSigner, spiffeid.RequireTrustDomainFromString("foo_bar.example"))
	impostor := strings.TrimPrefix(hashed, "trustbridge.io:svid:")
	assert.NotEqual(t, hashed, trustBundleName(testSigner, spiffeid.RequireTrustDomainFromString(impostor)),
		"a trust domain named td-<hash> is hashed too")

	store, _ := newStore(t, "peer.example")
	want, _ := renderTrustBundles(store.Snapshot(), testSigner)
	for name, w := range want {
		assert.Equal(t, trustBundleName(testSigner, spiffeid.RequireTrustDomainFromString(w.trustDomain)), name)
	}
}

// A peer that only reorders its roots changes no byte of its bundle.
func TestRenderTrustBundleStableOrder(t *testing.T) {
	a, b := testca.New(t, "peer.example"), testca.New(t, "peer.example")
	td := spiffeid.RequireTrustDomainFromString("peer.example")
	one, skip := renderTrustBundle(td, []*x509.Certificate{a.Cert, b.Cert}, testSigner)
	require.Nil(t, skip)
	two, skip := renderTrustBundle(td, []*x509.Certificate{b.Cert, a.Cert}, testSigner)
	require.Nil(t, skip)
	assert.Equal(t, one.pem, two.pem)
}
