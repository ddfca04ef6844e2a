package certservice_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// paymentsID is the identity a downstream impersonates: not its own, and
// not one --downstream-allow names.
var paymentsID = spiffeid.RequireFromString("spiffe://example.org/ns/payments/sa/api")

// newDownstreamAuthority is a self-signed CA whose roots leave room for
// downstream intermediates, as a server with --downstream-allow has.
func newDownstreamAuthority(tb testing.TB) *ca.Authority {
	tb.Helper()
	a, err := ca.New(ca.Config{TrustDomain: td, DataDir: tb.TempDir(), SignsIntermediates: true})
	require.NoError(tb, err)
	return a
}

// downstreamCA is what a downstream trustbridge holds: the intermediate
// our CA signed for it (with the chain above it, roots excluded) and its
// key.
type downstreamCA struct {
	chain []*x509.Certificate
	key   crypto.Signer
}

// intermediateCSR is a downstream's request for an intermediate, with a
// fresh key.
func intermediateCSR(t *testing.T) (der []byte, key crypto.Signer) {
	t.Helper()
	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(t, err)
	block, _ := pem.Decode([]byte(newCSR(t, key, "spiffe://example.org")))
	require.NotNil(t, block)
	return block.Bytes, key
}

// newDownstreamCA has a sign a downstream's intermediate, as
// SignIntermediate does for a caller --downstream-allow names.
func newDownstreamCA(t *testing.T, a *ca.Authority) *downstreamCA {
	t.Helper()
	der, key := intermediateCSR(t)
	csr, err := ca.ParseCSR(der)
	require.NoError(t, err)
	chain, err := a.SignIntermediate(csr, time.Hour)
	require.NoError(t, err)
	return &downstreamCA{chain: chain.Chain, key: key}
}

// downstreamLeaf is a leaf of id the downstream mints itself, with exts
// (a grant record of its choosing), presented with its chain.
func downstreamLeaf(t *testing.T, d *downstreamCA, id spiffeid.ID, exts ...pkix.Extension) *tls.Certificate {
	t.Helper()
	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(t, err)
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	require.NoError(t, err)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(30 * time.Minute),
		KeyUsage:        x509.KeyUsageDigitalSignature,
		ExtKeyUsage:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		URIs:            []*url.URL{id.URL()},
		ExtraExtensions: exts,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, d.chain[0], key.Public(), d.key)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	cert := tlsCert(leaf, key)
	for _, c := range d.chain {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	return cert
}

// TestDownstreamForgedGrantRefused is the attack end to end: a downstream
// that --downstream-allow names gets an intermediate from the service,
// mints a leaf of another identity, or of its own downstream ID (the
// headline of docs/upstream-trustbridge.md: an SVID minted from the
// region's own intermediate, which would buy it intermediates forever),
// with a grant record the grant checker would accept (a service
// account's, with its real UID; a bootstrap token's reference; none,
// which renews as legacy), and presents it. The leaf verifies against our
// roots, but our CA did not sign it: a renewal is refused with the
// reason, as are JWT-SVIDs and intermediates (counted), and nothing is
// signed.
func TestDownstreamForgedGrantRefused(t *testing.T) {
	for _, who := range []struct {
		name string
		id   spiffeid.ID
	}{
		{"another identity", paymentsID},
		{"its own downstream ID", downstreamID},
	} {
		t.Run(who.name, func(t *testing.T) { testDownstreamForgedGrantRefused(t, who.id) })
	}
}

func testDownstreamForgedGrantRefused(t *testing.T, id spiffeid.ID) {
	for _, tc := range []struct {
		name  string
		grant func(g *grantFixture) []pkix.Extension
	}{
		{name: "service account grant", grant: func(g *grantFixture) []pkix.Extension {
			return []pkix.Extension{grantExt(t, authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "default/web", UID: "uid-1", GrantedAt: g.clk.Now()})}
		}},
		{name: "bootstrap grant", grant: func(g *grantFixture) []pkix.Extension {
			ref := authn.BootstrapGrantRef(sha256.Sum256([]byte(bootstrapToken)))
			return []pkix.Extension{grantExt(t, authn.Grant{Method: authn.MethodBootstrapToken, Ref: ref, GrantedAt: g.clk.Now()})}
		}},
		{name: "no grant record", grant: func(*grantFixture) []pkix.Extension { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			jwt := newFakeJWTSigner(t)
			g := newGrantFixtureOn(t, newDownstreamAuthority(t), 0, newFakeAccounts(), func(cfg *certservice.Config, a *ca.Authority) {
				cfg.Intermediates = a // our own CA signs downstreams' intermediates
				cfg.DownstreamAllow = []spiffeid.ID{downstreamID}
				cfg.TrustDomain = td
				cfg.JWT = jwt
			})
			// The downstream, granted by its service account, buys an
			// intermediate of ours.
			region := grantedSVID(t, g.authority, downstreamID, grantExt(t, authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "default/web", UID: "uid-1", GrantedAt: g.start}))
			csr, key := intermediateCSR(t)
			resp, err := g.identityClient(t, region, "").SignIntermediate(t.Context(), &identityapi.SignIntermediateRequest{Csr: csr})
			require.NoError(t, err)
			d := &downstreamCA{key: key}
			for _, der := range resp.GetCertChain() {
				c, err := x509.ParseCertificate(der)
				require.NoError(t, err)
				d.chain = append(d.chain, c)
			}
			forged := downstreamLeaf(t, d, id, tc.grant(g)...)
			signed := g.signer.calls.Load()

			_, err = request(t, g.client(t, forged, ""))
			require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
			assert.Contains(t, status.Convert(err).Message(), "not issued by this server's CA")
			assert.Contains(t, status.Convert(err).Message(), "renew it at the CA that issued it")
			assert.Equal(t, signed, g.signer.calls.Load(), "nothing signed")
			assert.Equal(t, 1.0, g.checks("unknown", "invalid"), "counted as a grant refusal")
			logs := g.logs.String()
			assert.Contains(t, logs, `"reason":"grant_invalid"`)
			assert.Contains(t, logs, authn.ErrNotIssuedHere.Error())
			assert.Contains(t, logs, d.chain[0].Subject.String(), "the log names the issuer")

			ic := g.identityClient(t, forged, "")
			_, err = ic.MintJWTSVID(t.Context(), &identityapi.MintJWTSVIDRequest{Audience: []string{"a"}})
			assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
			assert.Contains(t, status.Convert(err).Message(), "not issued by this server's CA")
			_, _, _, jwts := jwt.last()
			assert.Zero(t, jwts, "no JWT-SVID minted")
			_, err = ic.SignIntermediate(t.Context(), &identityapi.SignIntermediateRequest{Csr: derCSR(t, "spiffe://example.org")})
			assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
			assert.Contains(t, status.Convert(err).Message(), "not issued by this server's CA")
			assert.Equal(t, 1.0, testutil.ToFloat64(g.svc.IntermediatesForTest(codes.Unauthenticated.String(), "none")), "the refusal counted")
			assert.Equal(t, 1.0, testutil.ToFloat64(g.svc.IntermediatesForTest(codes.OK.String(), authn.MethodX509SVID)), "only the downstream's own")
			assert.Equal(t, signed, g.signer.calls.Load(), "nothing signed")
		})
	}
}

// TestOwnLeavesRenewAcrossRootRotation: a leaf of our previous root, now
// retired but still published, renews after a rotation, its grant copied
// into a leaf of the new root, which renews in turn.
func TestOwnLeavesRenewAcrossRootRotation(t *testing.T) {
	// The CA's clock starts ten minutes back and moves past the new
	// root's publication lead, so that every certificate is valid now.
	clk := clocktesting.NewFakeClock(time.Now().Add(-10 * time.Minute))
	a, err := ca.New(ca.Config{TrustDomain: td, DataDir: t.TempDir(), Clock: clk, RefreshHint: time.Minute})
	require.NoError(t, err)
	g := newGrantFixtureOn(t, a, 0, nil)
	first, err := request(t, g.client(t, nil, bootstrapToken))
	require.NoError(t, err)
	oldRoot := a.Roots()[0].Cert
	require.NoError(t, first.Leaf.CheckSignatureFrom(oldRoot))

	require.NoError(t, prepareRoot(a))
	require.NoError(t, a.Reconcile()) // published: the lead starts
	clk.Step(ca.PublishLead*time.Minute + time.Second)
	require.NoError(t, a.Reconcile())
	roots := a.Roots()
	require.Len(t, roots, 2)
	require.Equal(t, castate.StateRetired, roots[0].State)
	require.Equal(t, castate.StateActive, roots[1].State)

	renewed, err := request(t, g.client(t, first, ""))
	require.NoError(t, err, "a leaf of the retired root renews")
	require.NoError(t, renewed.Leaf.CheckSignatureFrom(roots[1].Cert), "signed by the new root")
	assert.Equal(t, grantOf(t, first), grantOf(t, renewed))
	again, err := request(t, g.client(t, renewed, ""))
	require.NoError(t, err)
	assert.Equal(t, grantOf(t, first), grantOf(t, again))
	assert.Zero(t, g.checks("unknown", "invalid"))
}

// upstreamOf is an upstream authority signing our CA's intermediate with
// the fake's root.
type upstreamOf struct{ *fakeIntermediates }

func (u upstreamOf) SignIntermediate(_ context.Context, der []byte, ttl time.Duration) (*ca.UpstreamChain, error) {
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	return u.issue(csr, ttl, &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: "our intermediate"}, NotBefore: time.Now().Add(-time.Minute)})
}

// TestUpstreamModeGrants: under an upstream, a leaf our intermediate
// signed renews with its grant; one the upstream's own CA signed, for
// the same identity and with the same grant, authenticates but is refused
// renewal: the upstream is not this server's CA.
func TestUpstreamModeGrants(t *testing.T) {
	up := newFakeIntermediates(t)
	a, err := ca.New(ca.Config{TrustDomain: td, DataDir: t.TempDir(), Upstream: upstreamOf{up}, UpstreamTTL: 2 * time.Hour})
	require.NoError(t, err)
	require.NoError(t, a.Ready())
	g := newGrantFixtureOn(t, a, 0, newFakeAccounts())
	grant := grantExt(t, authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "default/web", UID: "uid-1", GrantedAt: g.start})

	ours := grantedSVID(t, a, paymentsID, grant)
	inter := a.Roots()[0].Cert
	require.NoError(t, ours.Leaf.CheckSignatureFrom(inter), "signed by our intermediate")
	ours.Certificate = append(ours.Certificate, inter.Raw)
	renewed, err := request(t, g.client(t, ours, ""))
	require.NoError(t, err)
	assert.Equal(t, grantOf(t, ours), grantOf(t, renewed))

	theirs := downstreamLeaf(t, &downstreamCA{chain: []*x509.Certificate{up.root}, key: up.rootKey.(crypto.Signer)}, paymentsID, grant)
	theirs.Certificate = theirs.Certificate[:1] // the root is in our bundle
	signed := g.signer.calls.Load()
	_, err = request(t, g.client(t, theirs, ""))
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "not issued by this server's CA")
	assert.Equal(t, signed, g.signer.calls.Load(), "nothing signed")
	assert.Contains(t, g.logs.String(), `issued by \"CN=fake upstream root\"`)
}
