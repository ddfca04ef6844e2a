package certservice_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
)

// grantFixture is a certificate service that authenticates X509-SVIDs and
// the bootstrap tokens of a file, checks bootstrap grants against that
// file and Kubernetes grants with kube, on a fake clock.
type grantFixture struct {
	*fixture
	clk   *clocktesting.FakeClock
	boot  *authn.BootstrapTokens
	path  string
	start time.Time
}

// newGrantFixture starts a grantFixture; mutate may set the rest of the
// config (the identity service's parts).
func newGrantFixture(t *testing.T, maxLifetime time.Duration, kube authn.GrantChecker, mutate ...func(*certservice.Config, *ca.Authority)) *grantFixture {
	t.Helper()
	return newGrantFixtureOn(t, newAuthority(t, td), maxLifetime, kube, mutate...)
}

// newGrantFixtureOn is newGrantFixture backed by authority. As the server
// does, the X509-SVID authenticator reads grants only from leaves the
// authority signed.
func newGrantFixtureOn(t *testing.T, authority *ca.Authority, maxLifetime time.Duration, kube authn.GrantChecker, mutate ...func(*certservice.Config, *ca.Authority)) *grantFixture {
	t.Helper()
	g := &grantFixture{
		clk:  clocktesting.NewFakeClock(time.Now()),
		path: filepath.Join(t.TempDir(), "tokens.csv"),
	}
	g.start = g.clk.Now()
	require.NoError(t, os.WriteFile(g.path, []byte(bootstrapToken+","+bootID.String()+"\n"), 0o600))
	boot, err := authn.LoadBootstrapTokens(g.path, td)
	require.NoError(t, err)
	g.boot = boot
	g.fixture = newFixtureOn(t, authority, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.Authenticator = authn.Chain{authn.NewX509SVID(td, localRoots{a}, nil, authn.WithOwnIssuers(a.IssuedHere)), boot}
		cfg.Grants = map[string]authn.GrantChecker{authn.MethodBootstrapToken: boot}
		if kube != nil {
			cfg.Grants[authn.MethodKubernetesJWT] = kube
			// The same checker stands in for the issuers' (oidc.Authenticator).
			cfg.Grants[authn.MethodOIDC] = kube
		}
		cfg.MaxRenewalLifetime = maxLifetime
		cfg.Clock = g.clk
		for _, m := range mutate {
			m(cfg, a)
		}
	})
	return g
}

// request asks for a certificate with a fresh key, as the caller the
// client authenticates as, and returns it as a client certificate.
func request(t *testing.T, c securityv1alpha1.IstioCertificateServiceClient) (*tls.Certificate, error) {
	t.Helper()
	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(t, err)
	resp, err := c.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: newCSR(t, key), ValidityDuration: 3600})
	if err != nil {
		return nil, err
	}
	return tlsCert(parseChain(t, resp.CertChain)[0], key), nil
}

// grantedSVID is an SVID our CA signed with ext, as an earlier issuance
// would have.
func grantedSVID(t *testing.T, a *ca.Authority, id spiffeid.ID, ext pkix.Extension) *tls.Certificate {
	t.Helper()
	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(t, err)
	issued, err := a.SignX509SVID(ca.X509SVIDParams{PublicKey: key.Public(), SPIFFEID: id, TTL: time.Hour, Extensions: []pkix.Extension{ext}})
	require.NoError(t, err)
	return tlsCert(issued.Leaf, key)
}

func grantExt(t *testing.T, g authn.Grant) pkix.Extension {
	t.Helper()
	ext, err := g.Extension()
	require.NoError(t, err)
	return ext
}

func grantOf(t *testing.T, cert *tls.Certificate) authn.Grant {
	t.Helper()
	g, err := authn.GrantFromCert(cert.Leaf)
	require.NoError(t, err)
	return g
}

func (g *grantFixture) checks(method, result string) float64 {
	return testutil.ToFloat64(g.svc.GrantChecksForTest(method, result))
}

func TestGrantRecordedAndCopiedAcrossRenewals(t *testing.T) {
	g := newGrantFixture(t, 0, nil)
	first, err := request(t, g.client(t, nil, bootstrapToken))
	require.NoError(t, err)
	want := authn.Grant{
		Method:    authn.MethodBootstrapToken,
		Ref:       authn.BootstrapGrantRef(sha256.Sum256([]byte(bootstrapToken))),
		GrantedAt: g.start.UTC().Truncate(time.Second),
	}
	assert.Equal(t, want, grantOf(t, first))
	for _, e := range first.Leaf.Extensions {
		if e.Id.Equal(authn.GrantOID) {
			assert.False(t, e.Critical)
		}
	}

	cert := first
	for i := range 3 {
		g.clk.Step(time.Hour)
		cert, err = request(t, g.client(t, cert, ""))
		require.NoError(t, err, "renewal %d", i)
		assert.Equal(t, want, grantOf(t, cert), "renewal %d copies the first grant, time included", i)
	}
	assert.Equal(t, 3.0, g.checks(authn.MethodBootstrapToken, "accepted"))
	logs := g.logs.String()
	assert.Contains(t, logs, `"grant_method":"bootstrap-token"`)
	assert.Contains(t, logs, `"grant_ref":"`+want.Ref+`"`)
	assert.NotContains(t, logs, bootstrapToken)
}

func TestRenewalRefused(t *testing.T) {
	const maxLifetime = 30 * 24 * time.Hour
	kubeGrant := authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "default/web", UID: "uid-1"}
	bootGrant := authn.Grant{Method: authn.MethodBootstrapToken, Ref: authn.BootstrapGrantRef(sha256.Sum256([]byte(bootstrapToken)))}

	tests := []struct {
		name string
		// cert is the SVID the renewal presents; grantedAt is g.start.
		cert     func(t *testing.T, g *grantFixture) *tls.Certificate
		kube     authn.GrantChecker // nil: the server does not check Kubernetes grants
		before   func(t *testing.T, g *grantFixture)
		age      time.Duration // the fake clock's step before renewing
		wantCode codes.Code
		wantMsg  string
		wantLog  string
		metric   [2]string
	}{
		{
			name: "bootstrap token removed from the file",
			cert: func(t *testing.T, g *grantFixture) *tls.Certificate {
				c, err := request(t, g.client(t, nil, bootstrapToken))
				require.NoError(t, err)
				return c
			},
			before: func(t *testing.T, g *grantFixture) {
				require.NoError(t, os.WriteFile(g.path, []byte("# emptied\n"), 0o600))
				require.NoError(t, g.boot.Reload())
			},
			wantCode: codes.PermissionDenied,
			wantMsg:  "the bootstrap token that granted " + bootID.String() + " (reference " + bootGrant.Ref + ") was removed; bootstrap again",
			wantLog:  `"reason":"grant_revoked"`,
			metric:   [2]string{authn.MethodBootstrapToken, "revoked"},
		},
		{
			name: "service account deleted",
			cert: func(t *testing.T, g *grantFixture) *tls.Certificate {
				kg := kubeGrant
				kg.GrantedAt = g.start
				return grantedSVID(t, g.authority, workloadID, grantExt(t, kg))
			},
			kube: authn.GrantCheckerFunc(func(context.Context, spiffeid.ID, authn.Grant) error {
				return authn.ErrGrantRevoked
			}),
			wantCode: codes.PermissionDenied,
			wantMsg:  "the service account default/web that granted " + workloadID.String() + " was deleted or re-created",
			wantLog:  `"reason":"grant_revoked"`,
			metric:   [2]string{authn.MethodKubernetesJWT, "revoked"},
		},
		{
			name: "Kubernetes API not answering",
			cert: func(t *testing.T, g *grantFixture) *tls.Certificate {
				kg := kubeGrant
				kg.GrantedAt = g.start
				return grantedSVID(t, g.authority, workloadID, grantExt(t, kg))
			},
			kube: authn.GrantCheckerFunc(func(context.Context, spiffeid.ID, authn.Grant) error {
				return authn.ErrUnavailable
			}),
			wantCode: codes.Unavailable,
			wantMsg:  "retry later",
			wantLog:  `"reason":"grant_unavailable"`,
			metric:   [2]string{authn.MethodKubernetesJWT, "unavailable"},
		},
		{
			name: "server no longer checks Kubernetes grants",
			cert: func(t *testing.T, g *grantFixture) *tls.Certificate {
				kg := kubeGrant
				kg.GrantedAt = g.start
				return grantedSVID(t, g.authority, workloadID, grantExt(t, kg))
			},
			wantCode: codes.PermissionDenied,
			wantMsg:  "granted by a kubernetes-jwt, which this server no longer accepts",
			wantLog:  `"reason":"grant_revoked"`,
			metric:   [2]string{authn.MethodKubernetesJWT, "revoked"},
		},
		{
			name: "chain older than the maximum renewal lifetime",
			cert: func(t *testing.T, g *grantFixture) *tls.Certificate {
				bg := bootGrant
				bg.GrantedAt = g.start
				return grantedSVID(t, g.authority, bootID, grantExt(t, bg))
			},
			age:      maxLifetime + time.Second,
			wantCode: codes.PermissionDenied,
			wantMsg:  "more than the maximum renewal lifetime of 720h0m0s ago",
			wantLog:  `"reason":"renewal_lifetime_exceeded"`,
			metric:   [2]string{authn.MethodBootstrapToken, "lifetime_exceeded"},
		},
		{
			name: "chain older than its issuer's maxRenewalLifetime",
			cert: func(t *testing.T, g *grantFixture) *tls.Certificate {
				og := authn.Grant{Method: authn.MethodOIDC, Ref: "ci", UID: authn.IssuerGrantUID("https://ci.example"), GrantedAt: g.start}
				return grantedSVID(t, g.authority, workloadID, grantExt(t, og))
			},
			kube: authn.GrantCheckerFunc(func(context.Context, spiffeid.ID, authn.Grant) error {
				return fmt.Errorf("authn: oidc: granted by issuer \"ci\", longer ago than its maxRenewalLifetime of 24h0m0s: %w", authn.ErrGrantExpired)
			}),
			age:      time.Hour, // within the server-wide maximum: the issuer's own limit ended it
			wantCode: codes.PermissionDenied,
			wantMsg:  "by token issuer \"ci\", longer ago than that issuer's maxRenewalLifetime allows; obtain a new certificate with a fresh token",
			wantLog:  `"reason":"renewal_lifetime_exceeded"`,
			metric:   [2]string{authn.MethodOIDC, "lifetime_exceeded"},
		},
		{
			name: "legacy certificate older than the maximum renewal lifetime",
			cert: func(t *testing.T, g *grantFixture) *tls.Certificate {
				return svid(t, g.authority, workloadID) // NotBefore is about g.start
			},
			age:      maxLifetime + time.Minute,
			wantCode: codes.PermissionDenied,
			wantMsg:  "maximum renewal lifetime",
			wantLog:  `"reason":"renewal_lifetime_exceeded"`,
			metric:   [2]string{authn.GrantMethodLegacy, "lifetime_exceeded"},
		},
		{
			name: "certificate minted by SDS",
			cert: func(t *testing.T, g *grantFixture) *tls.Certificate {
				return grantedSVID(t, g.authority, workloadID, grantExt(t, authn.Grant{Method: authn.GrantMethodSDS, GrantedAt: g.start}))
			},
			wantCode: codes.PermissionDenied,
			wantMsg:  "was minted by SDS for Envoy and cannot be renewed",
			wantLog:  `"reason":"grant_revoked"`,
			metric:   [2]string{authn.GrantMethodSDS, "revoked"},
		},
		{
			name: "grant record does not parse",
			cert: func(t *testing.T, g *grantFixture) *tls.Certificate {
				return grantedSVID(t, g.authority, workloadID, pkix.Extension{Id: authn.GrantOID, Value: []byte{0x30, 0x00}})
			},
			wantCode: codes.PermissionDenied,
			wantMsg:  "grant record cannot be read",
			wantLog:  `"reason":"grant_invalid"`,
			metric:   [2]string{"unknown", "invalid"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGrantFixture(t, maxLifetime, tt.kube)
			cert := tt.cert(t, g)
			if tt.before != nil {
				tt.before(t, g)
			}
			g.clk.Step(tt.age)
			calls := g.signer.calls.Load()
			_, err := request(t, g.client(t, cert, ""))
			require.Error(t, err)
			st := status.Convert(err)
			assert.Equal(t, tt.wantCode, st.Code())
			assert.Contains(t, st.Message(), tt.wantMsg)
			assert.Equal(t, calls, g.signer.calls.Load(), "nothing signed")
			assert.Contains(t, g.logs.String(), tt.wantLog)
			assert.Equal(t, 1.0, g.checks(tt.metric[0], tt.metric[1]))
		})
	}
}

func TestRenewalAccepted(t *testing.T) {
	const maxLifetime = 30 * 24 * time.Hour
	kubeGrant := authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "default/web", UID: "uid-1"}
	var seen []authn.Grant
	kube := authn.GrantCheckerFunc(func(_ context.Context, id spiffeid.ID, g authn.Grant) error {
		seen = append(seen, g)
		return nil
	})

	t.Run("service account still there, at the maximum lifetime", func(t *testing.T) {
		g := newGrantFixture(t, maxLifetime, kube)
		kg := kubeGrant
		kg.GrantedAt = g.start.UTC().Truncate(time.Second)
		cert := grantedSVID(t, g.authority, workloadID, grantExt(t, kg))
		g.clk.Step(maxLifetime - time.Second)
		renewed, err := request(t, g.client(t, cert, ""))
		require.NoError(t, err)
		assert.Equal(t, kg, grantOf(t, renewed))
		assert.Equal(t, []authn.Grant{kg}, seen)
		assert.Contains(t, g.logs.String(), `"grant_uid":"uid-1"`)
	})
	t.Run("legacy certificate renews with a warning and is dated from then on", func(t *testing.T) {
		g := newGrantFixture(t, 0, nil)
		cert := svid(t, g.authority, workloadID)
		renewed, err := request(t, g.client(t, cert, ""))
		require.NoError(t, err)
		assert.Equal(t, authn.Grant{Method: authn.GrantMethodLegacy, GrantedAt: cert.Leaf.NotBefore.UTC()}, grantOf(t, renewed))
		assert.Contains(t, g.logs.String(), "renewing a certificate that records no grant")
		assert.Equal(t, 1.0, g.checks(authn.GrantMethodLegacy, "accepted"))
	})
}

func TestNewRejectsNegativeRenewalLifetime(t *testing.T) {
	_, err := certservice.New(certservice.Config{
		Signer:             certservice.SignerFunc(nil),
		Authenticator:      fakeTokens,
		MaxRenewalLifetime: -time.Second,
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "maximum renewal lifetime -1s is negative")
}

// The grant comes from authentication alone: a CSR asking for a grant
// extension of its own (an old grant time, to escape
// --max-renewal-lifetime, or another method) is either refused or signed
// without it, and the leaf carries the grant the caller proved.
func TestCSRCannotPlantAGrant(t *testing.T) {
	g := newGrantFixture(t, time.Hour, nil)
	forged := grantExt(t, authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "default/web", UID: "uid-1", GrantedAt: g.start.Add(100 * 24 * time.Hour)})
	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(t, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{forged}}, key)
	require.NoError(t, err)
	csr := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))

	resp, err := g.client(t, nil, bootstrapToken).CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
	if err != nil {
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "refused as an invalid CSR, if refused")
		return
	}
	leaf := parseChain(t, resp.CertChain)[0]
	var grants int
	for _, e := range leaf.Extensions {
		if e.Id.Equal(authn.GrantOID) {
			grants++
		}
	}
	assert.Equal(t, 1, grants, "one grant extension, ours")
	got, err := authn.GrantFromCert(leaf)
	require.NoError(t, err)
	assert.Equal(t, authn.MethodBootstrapToken, got.Method, "the proven grant, not the CSR's")
	assert.Equal(t, g.start.UTC().Truncate(time.Second), got.GrantedAt)
}
