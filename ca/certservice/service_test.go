package certservice_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/identityapi"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	goodToken      = "good-token-0123456789"
	bootstrapToken = "bootstrap-token-abcdefghijklmnop"
)

var (
	workloadID = spiffeid.RequireFromString("spiffe://example.org/ns/default/sa/web")
	tokenID    = spiffeid.RequireFromString("spiffe://example.org/vm/laptop")
	bootID     = spiffeid.RequireFromString("spiffe://example.org/vm/bootstrap")
)

// fakeTokens accepts goodToken as tokenID; any other bearer token is bad,
// and no token is no credentials.
var fakeTokens = authn.AuthenticatorFunc(func(_ context.Context, r authn.Request) (authn.Identity, error) {
	switch r.BearerToken {
	case "":
		return authn.Identity{}, authn.ErrNoCredentials
	case goodToken:
		return authn.Identity{ID: tokenID, Method: "fake-token"}, nil
	}
	return authn.Identity{}, authn.ErrInvalidCredentials
})

// fakeAPIServer answers TokenReviews: jwt is a valid token of
// default/web for audience example.org.
func fakeAPIServer(jwt string) *fake.Clientset {
	kc := fake.NewClientset()
	kc.PrependReactor("create", "tokenreviews", func(action k8stesting.Action) (bool, runtime.Object, error) {
		tr := action.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
		if tr.Spec.Token == jwt && slices.Contains(tr.Spec.Audiences, "example.org") {
			tr.Status = authenticationv1.TokenReviewStatus{
				Authenticated: true,
				User:          authenticationv1.UserInfo{Username: "system:serviceaccount:default:web"},
				Audiences:     []string{"example.org"},
			}
		} else {
			tr.Status = authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		return true, tr, nil
	})
	return kc
}

func writeBootstrapFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens.csv")
	require.NoError(t, os.WriteFile(p, []byte("# bootstrap\n"+bootstrapToken+","+bootID.String()+"\n"), 0o600))
	return p
}

// allAuthenticators is the server's order: X509-SVID, TokenReview,
// bootstrap tokens, and a fake opaque-token authenticator.
func allAuthenticators(t *testing.T, jwt string) func(*certservice.Config, *ca.Authority) {
	return func(cfg *certservice.Config, a *ca.Authority) {
		tr, err := authn.NewTokenReview(authn.TokenReviewConfig{Client: fakeAPIServer(jwt), TrustDomain: td})
		require.NoError(t, err)
		boot, err := authn.LoadBootstrapTokens(writeBootstrapFile(t), td)
		require.NoError(t, err)
		cfg.Authenticator = authn.Chain{authn.NewX509SVID(td, localRoots{a}, nil), tr, boot, fakeTokens}
	}
}

func TestCreateCertificateAuthenticators(t *testing.T) {
	jwt := fakeJWT(time.Now().Add(time.Hour))
	f := newFixture(t, allAuthenticators(t, jwt))
	mtlsID := spiffeid.RequireFromString("spiffe://example.org/ns/prod/sa/api")

	tests := []struct {
		name   string
		client securityv1alpha1.IstioCertificateServiceClient
		want   spiffeid.ID
		method string
	}{
		{"mtls local SVID", f.client(t, svid(t, f.authority, mtlsID), ""), mtlsID, authn.MethodX509SVID},
		{"kubernetes JWT", f.client(t, nil, jwt), workloadID, authn.MethodKubernetesJWT},
		{"bootstrap token", f.client(t, nil, bootstrapToken), bootID, authn.MethodBootstrapToken},
		{"opaque token", f.client(t, nil, goodToken), tokenID, "fake-token"},
		{"mtls wins over a bad token", f.client(t, svid(t, f.authority, mtlsID), "not-a-known-token-000"), mtlsID, authn.MethodX509SVID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The CSR asks for the identity the caller proves: Istio's agents
			// do; the answer would be the same without it.
			resp, err := tt.client.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{
				Csr: freshCSR(t, tt.want.String()), ValidityDuration: 3600,
			})
			require.NoError(t, err)
			chain := parseChain(t, resp.CertChain)
			require.Len(t, chain, 2, "leaf, then the one root")
			got, verified, err := x509svid.Verify(chain[:1], f.authority.Bundle().X509Bundle())
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			assert.True(t, verified[0][len(verified[0])-1].Equal(chain[1]), "the last element is the root")
			assert.WithinDuration(t, time.Now().Add(time.Hour), chain[0].NotAfter, time.Minute)
			assert.Contains(t, f.logs.String(), `"spiffe_id":"`+tt.want.String()+`","method":"`+tt.method+`"`)
		})
	}
	assert.NotContains(t, f.logs.String(), bootstrapToken)
	assert.NotContains(t, f.logs.String(), goodToken)
	assert.NotContains(t, f.logs.String(), jwt)
	assert.Equal(t, float64(2), certRequests(t, f, "OK", authn.MethodX509SVID))
}

func certRequests(t *testing.T, f *fixture, code, method string) float64 {
	t.Helper()
	n, err := testutil.GatherAndCount(f.reg, "trustbridge_certservice_requests_total")
	require.NoError(t, err)
	require.NotZero(t, n)
	mfs, err := f.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "trustbridge_certservice_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["code"] == code && labels["method"] == method {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func TestCreateCertificateRefusals(t *testing.T) {
	jwt := fakeJWT(time.Now().Add(time.Hour))
	f := newFixture(t, allAuthenticators(t, jwt))
	other := newAuthority(t, spiffeid.RequireTrustDomainFromString("other.example"))
	// A CA that is not ours minting an ID of our trust domain.
	forger := testca.New(t, "example.org", testca.Options{})
	forgedLeaf, forgedKey := forger.Issue(t, workloadID)
	forged := tlsCert(forgedLeaf, forgedKey)
	local := svid(t, f.authority, workloadID)

	tests := []struct {
		name     string
		client   securityv1alpha1.IstioCertificateServiceClient
		req      *securityv1alpha1.IstioCertificateRequest
		code     codes.Code
		msg      string
		signerOK bool // whether the signer may have been called
	}{
		{name: "no credentials", client: f.client(t, nil, ""), code: codes.Unauthenticated, msg: "no valid credentials"},
		{name: "unknown bearer token", client: f.client(t, nil, "unknown-token-0123456789"), code: codes.Unauthenticated},
		{name: "rejected JWT", client: f.client(t, nil, fakeJWT(time.Now().Add(time.Hour).Add(time.Second))), code: codes.Unauthenticated},
		{name: "expired JWT", client: f.client(t, nil, fakeJWT(time.Now().Add(-time.Minute))), code: codes.Unauthenticated},
		{name: "federated SVID", client: f.client(t, svid(t, other, spiffeid.RequireFromString("spiffe://other.example/w")), ""), code: codes.Unauthenticated},
		{name: "SVID of our trust domain from another CA", client: f.client(t, forged, ""), code: codes.Unauthenticated},
		{name: "garbage CSR", client: f.client(t, local, ""), req: &securityv1alpha1.IstioCertificateRequest{Csr: "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"},
			code: codes.InvalidArgument, msg: "invalid CSR"},
		{name: "empty CSR", client: f.client(t, local, ""), req: &securityv1alpha1.IstioCertificateRequest{}, code: codes.InvalidArgument},
		{name: "CSR for another identity", client: f.client(t, local, ""),
			req:  &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t, "spiffe://example.org/ns/kube-system/sa/admin")},
			code: codes.PermissionDenied, msg: "different identity"},
		{name: "CSR for another trust domain", client: f.client(t, nil, bootstrapToken),
			req:  &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t, "spiffe://other.example/vm/bootstrap")},
			code: codes.PermissionDenied},
		{name: "CSR for two identities", client: f.client(t, local, ""),
			req:  &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t, workloadID.String(), "spiffe://example.org/x")},
			code: codes.PermissionDenied},
		{name: "impersonation metadata", client: f.client(t, local, ""),
			req: &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t), Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
				"ImpersonatedIdentity": structpb.NewStringValue("spiffe://example.org/ns/a/sa/b")}}},
			code: codes.PermissionDenied, msg: "impersonation"},
		{name: "negative TTL", client: f.client(t, local, ""), req: &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t), ValidityDuration: -1},
			code: codes.InvalidArgument, msg: "negative"},
		{name: "TTL over the maximum", client: f.client(t, local, ""), req: &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t), ValidityDuration: 365 * 24 * 3600},
			code: codes.InvalidArgument, msg: "invalid TTL", signerOK: true},
		{name: "TTL beyond a Duration", client: f.client(t, local, ""), req: &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t), ValidityDuration: math.MaxInt64},
			code: codes.InvalidArgument, msg: "invalid TTL", signerOK: true},
		// Names other than the SPIFFE ID are refused before the signer
		// sees the CSR, whatever the Signer does with them.
		{name: "DNS SAN", client: f.client(t, local, ""), req: &securityv1alpha1.IstioCertificateRequest{Csr: csrWithDNS(t)},
			code: codes.InvalidArgument, msg: "DNS SANs"},
		{name: "IP SAN", client: f.client(t, local, ""), req: &securityv1alpha1.IstioCertificateRequest{Csr: csrWith(t, &x509.CertificateRequest{IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})},
			code: codes.InvalidArgument, msg: "IP SANs"},
		{name: "email SAN", client: f.client(t, local, ""), req: &securityv1alpha1.IstioCertificateRequest{Csr: csrWith(t, &x509.CertificateRequest{EmailAddresses: []string{"root@example.org"}})},
			code: codes.InvalidArgument, msg: "email SANs"},
		{name: "impersonation metadata, not a string", client: f.client(t, local, ""),
			req: &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t), Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
				"ImpersonatedIdentity": structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("spiffe://example.org/ns/a/sa/b")}})}}},
			code: codes.PermissionDenied, msg: "impersonation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := tt.req
			if req == nil {
				req = &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t)}
			}
			before := f.signer.calls.Load()
			resp, err := tt.client.CreateCertificate(t.Context(), req)
			assert.Nil(t, resp)
			assert.Equal(t, tt.code, status.Code(err), "%v", err)
			assert.Contains(t, status.Convert(err).Message(), tt.msg)
			if !tt.signerOK {
				assert.Equal(t, before, f.signer.calls.Load(), "the signer was never called")
			}
		})
	}
	logs := f.logs.String()
	assert.Contains(t, logs, `"msg":"certificate request refused","reason":"identity_not_allowed","code":"PermissionDenied","address":"127.0.0.1:`)
	assert.NotContains(t, logs, `"msg":"certificate issued"`, "nothing was issued")
}

// csrWith signs tmpl with a fresh key.
func csrWith(t *testing.T, tmpl *x509.CertificateRequest) string {
	t.Helper()
	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(t, err)
	der, err := x509.CreateCertificateRequest(nil, tmpl, key)
	require.NoError(t, err)
	return string(pemCSR(der))
}

// csrWithDNS asks for a DNS name next to the identity.
func csrWithDNS(t *testing.T) string {
	t.Helper()
	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(t, err)
	der, err := x509.CreateCertificateRequest(nil, &x509.CertificateRequest{DNSNames: []string{"evil.example"}}, key)
	require.NoError(t, err)
	return string(pemCSR(der))
}

func TestCreateCertificateServerFaults(t *testing.T) {
	tests := []struct {
		name   string
		signer certservice.Signer
		auth   authn.Authenticator
		code   codes.Code
		msg    string
	}{
		{
			name: "signing material",
			signer: certservice.SignerFunc(func(ca.X509SVIDParams) (*ca.Issued, error) {
				return nil, ca.ErrInvalidSigningMaterial
			}),
			code: codes.Unavailable, msg: "the CA cannot sign right now",
		},
		{
			name: "internal",
			signer: certservice.SignerFunc(func(ca.X509SVIDParams) (*ca.Issued, error) {
				return nil, errSecret
			}),
			code: codes.Internal, msg: "internal error",
		},
		{
			name: "signer returns nothing",
			signer: certservice.SignerFunc(func(ca.X509SVIDParams) (*ca.Issued, error) {
				return &ca.Issued{}, nil
			}),
			code: codes.Internal, msg: "internal error",
		},
		{
			name: "authentication backend down",
			auth: authn.Chain{authn.AuthenticatorFunc(func(context.Context, authn.Request) (authn.Identity, error) {
				return authn.Identity{}, authn.ErrUnavailable
			})},
			code: codes.Unavailable, msg: "authentication backend unavailable",
		},
		{
			name: "authentication backend down, the next authenticator refuses",
			auth: authn.Chain{
				authn.AuthenticatorFunc(func(context.Context, authn.Request) (authn.Identity, error) {
					return authn.Identity{}, authn.ErrUnavailable
				}),
				authn.AuthenticatorFunc(func(context.Context, authn.Request) (authn.Identity, error) {
					return authn.Identity{}, authn.ErrInvalidCredentials
				}),
			},
			code: codes.Unavailable, msg: "authentication backend unavailable",
		},
		{
			name: "token valid, its claims not allowed",
			auth: authn.Chain{authn.AuthenticatorFunc(func(context.Context, authn.Request) (authn.Identity, error) {
				return authn.Identity{}, fmt.Errorf("authn: oidc: issuer ci: claim ref %q not allowed: %w", "refs/heads/dev", authn.ErrPermissionDenied)
			})},
			code: codes.PermissionDenied, msg: "the token is valid, but its claims do not grant an identity",
		},
		{
			name: "claims not allowed, another authenticator unavailable",
			auth: authn.Chain{
				authn.AuthenticatorFunc(func(context.Context, authn.Request) (authn.Identity, error) {
					return authn.Identity{}, authn.ErrUnavailable
				}),
				authn.AuthenticatorFunc(func(context.Context, authn.Request) (authn.Identity, error) {
					return authn.Identity{}, authn.ErrPermissionDenied
				}),
			},
			code: codes.Unavailable, msg: "authentication backend unavailable",
		},
		{
			name: "authenticator returns an empty identity",
			auth: authn.AuthenticatorFunc(func(context.Context, authn.Request) (authn.Identity, error) {
				return authn.Identity{}, nil
			}),
			code: codes.Unauthenticated,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, func(cfg *certservice.Config, _ *ca.Authority) {
				cfg.Signer = tt.signer
				if tt.auth != nil {
					cfg.Authenticator = tt.auth
				}
			})
			c := f.client(t, svid(t, f.authority, workloadID), "")
			_, err := c.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t)})
			assert.Equal(t, tt.code, status.Code(err), "%v", err)
			assert.Equal(t, tt.msg, status.Convert(err).Message()[:len(tt.msg)])
			assert.NotContains(t, status.Convert(err).Message(), "secret")
			if tt.signer != nil && tt.code == codes.Internal {
				assert.Contains(t, f.logs.String(), `"level":"ERROR"`, "the cause is logged")
			}
		})
	}
}

func TestCreateCertificateMergedRoots(t *testing.T) {
	fed1 := testca.New(t, "a.example", testca.Options{})
	fed2 := testca.New(t, "b.example", testca.Options{})
	// evil.example publishes a root naming our trust domain, which a
	// client telling roots apart by their URI SAN would take for ours, and
	// one naming none (a plug-in CA's), which stays.
	forged := testca.New(t, "example.org")
	plain := testca.New(t, "evil.example", testca.Options{Mutate: func(c *x509.Certificate) { c.URIs = nil }})
	evil := spiffebundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString("evil.example"), []*x509.Certificate{forged.Cert, plain.Cert})
	var (
		local   *x509.Certificate
		localB  *spiffebundle.Bundle
		bundles *fakeBundles
	)
	f := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		localB = a.Bundle()
		local = localB.X509Authorities()[0]
		// a.example's bundle repeats a root; it is sent once. The local
		// bundle comes first in the answer wherever the source lists it.
		dup := spiffebundle.FromX509Authorities(fed1.TrustDomain, []*x509.Certificate{fed1.Cert, fed1.Cert})
		bundles = newFakeBundles(dup, localB, fed2.Bundle(), evil, nil)
		cfg.Bundles = bundles
		cfg.MergedRoots = true
	})
	c := f.client(t, svid(t, f.authority, workloadID), "")
	names := func() []string {
		resp, err := c.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t)})
		require.NoError(t, err)
		require.Len(t, resp.CertChain, 2, "the leaf, then every root in one element")
		var out []string
		for _, cert := range parseChain(t, resp.CertChain) {
			switch {
			case cert.Equal(forged.Cert):
				out = append(out, "forged")
			case cert.Equal(plain.Cert):
				out = append(out, "plain")
			default:
				out = append(out, name(cert, local, fed1.Cert, fed2.Cert))
			}
		}
		return out
	}
	assert.Equal(t, []string{"leaf", "local", "a", "b", "plain"}, names())
	assert.Equal(t, []string{"leaf", "local", "a", "b", "plain"}, names(), "the same trust again")
	bundles.set(fed2.Bundle(), localB)
	assert.Equal(t, []string{"leaf", "local", "b"}, names(), "a new trust")
}

// With --ca-response-roots merged, the roots CreateCertificate hands out
// follow the trust policy as SDS and WatchBundles do (issue 32): under a
// default-deny policy granting partner.example only to /billing, /app's
// answer carries no partner root while /billing's does, a trust domain
// granted only for some peers is withheld (a flat list cannot limit
// peers), and a policy change takes effect on the next request.
func TestCreateCertificateMergedRootsFollowTrustPolicy(t *testing.T) {
	partnerTD := spiffeid.RequireTrustDomainFromString("partner.example")
	partner := testca.New(t, partnerTD.Name())
	limited := testca.New(t, withheldTD.Name())
	app := spiffeid.RequireFromString("spiffe://example.org/app")
	billing := spiffeid.RequireFromString("spiffe://example.org/billing")
	compile := func(grantee spiffeid.ID) *trustpolicy.Policy {
		p, err := trustpolicy.Compile(td, trustpolicy.DefaultDeny, []trustpolicy.Rule{{
			Name:         "partner",
			Workloads:    []trustpolicy.Selector{{SPIFFEID: grantee.String()}},
			TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: partnerTD.Name()}},
		}, {
			Name:      "limited",
			Workloads: []trustpolicy.Selector{{SPIFFEID: billing.String()}},
			TrustDomains: []trustpolicy.TrustDomainGrant{
				{TrustDomain: withheldTD.Name(), Peers: []string{"spiffe://withheld.example/api"}},
			},
		}})
		require.NoError(t, err)
		return p
	}
	pol := &fakePolicy{p: compile(billing), ch: make(chan struct{})}
	f := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.Bundles = newFakeBundles(a.Bundle(), partner.Bundle(), limited.Bundle())
		cfg.Policy = pol
		cfg.MergedRoots = true
	})
	local := f.authority.Bundle().X509Authorities()[0]
	roots := func(id spiffeid.ID) []*x509.Certificate {
		c := f.client(t, svid(t, f.authority, id), "")
		resp, err := c.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t)})
		require.NoError(t, err)
		chain := parseChain(t, resp.CertChain)
		return chain[1:]
	}
	assert.Equal(t, []*x509.Certificate{local}, roots(app), "/app: the local roots only")
	assert.Equal(t, []*x509.Certificate{local, partner.Cert}, roots(billing), "/billing: partner's too, not the peer-limited one")

	pol.set(compile(app))
	assert.Equal(t, []*x509.Certificate{local, partner.Cert}, roots(app), "the next request follows the new policy")
	assert.Equal(t, []*x509.Certificate{local}, roots(billing))
}

// A node proxy's certificate for a workload of its node carries the
// workload's trust, decided by the service account the Impersonator saw,
// not the proxy's.
func TestCreateCertificateMergedRootsImpersonated(t *testing.T) {
	partner := testca.New(t, "partner.example")
	proxies := testca.New(t, "proxies.example")
	node := spiffeid.RequireFromString("spiffe://example.org/ns/istio-system/sa/ztunnel")
	const nodeToken = "node-token-0123456789"
	p, err := trustpolicy.Compile(td, trustpolicy.DefaultDeny, []trustpolicy.Rule{{
		Name:         "payments",
		Workloads:    []trustpolicy.Selector{{Namespace: "payments"}},
		TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: "partner.example"}},
	}, {
		Name:         "proxies",
		Workloads:    []trustpolicy.Selector{{Namespace: "istio-system"}},
		TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: "proxies.example"}},
	}})
	require.NoError(t, err)
	tokens := authn.AuthenticatorFunc(func(_ context.Context, r authn.Request) (authn.Identity, error) {
		if r.BearerToken != nodeToken {
			return authn.Identity{}, authn.ErrNoCredentials
		}
		return authn.Identity{ID: node, Method: authn.MethodKubernetesJWT,
			Grant: &authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "istio-system/ztunnel"}}, nil
	})
	f := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.Authenticator = tokens
		cfg.Bundles = newFakeBundles(a.Bundle(), partner.Bundle(), proxies.Bundle())
		cfg.Policy = &fakePolicy{p: p, ch: make(chan struct{})}
		cfg.MergedRoots = true
		cfg.Impersonator = fakeImpersonator{} // authorizes every target
	})
	local := f.authority.Bundle().X509Authorities()[0]
	c := f.client(t, nil, nodeToken)
	roots := func(target string) []*x509.Certificate {
		md, err := structpb.NewStruct(map[string]any{"ImpersonatedIdentity": target})
		require.NoError(t, err)
		resp, err := c.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t), Metadata: md})
		require.NoError(t, err)
		return parseChain(t, resp.CertChain)[1:]
	}
	assert.Equal(t, []*x509.Certificate{local, partner.Cert}, roots("spiffe://example.org/ns/payments/sa/api"))
	assert.Equal(t, []*x509.Certificate{local}, roots("spiffe://example.org/ns/web/sa/frontend"), "not the proxy's grant")
}

func TestNewRefusesMergedRootsWithoutBundles(t *testing.T) {
	a := newAuthority(t, td)
	_, err := certservice.New(certservice.Config{Signer: a, Authenticator: authn.Chain{}, MergedRoots: true})
	assert.ErrorContains(t, err, "merged roots need")
}

func name(c, local, a, b *x509.Certificate) string {
	switch {
	case c.Equal(local):
		return "local"
	case c.Equal(a):
		return "a"
	case c.Equal(b):
		return "b"
	}
	return "leaf"
}

// A request beyond the signing slots waits its turn and is served; one
// beyond the queue's bound is refused at once with ResourceExhausted,
// saying which flag to raise, and never reaches the signer.
func TestCreateCertificateQueueFull(t *testing.T) {
	entered := make(chan struct{}, 2)
	release := make(chan struct{})
	f := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.Concurrency, cfg.QueueSize = 1, 1
		cfg.Signer = heldSigner(a, entered, release)
	})
	queued := make(chan struct{}, 2)
	f.svc.OnQueuedForTest(func() { queued <- struct{}{} })
	c := f.client(t, svid(t, f.authority, workloadID), "")
	call := func() <-chan error { return createInBackground(t, c) }
	first := call()
	<-entered // the one slot is taken
	second := call()
	<-queued // the queue of one is full
	assert.Equal(t, 1.0, testutil.ToFloat64(f.svc.QueueWaitingForTest()))

	_, err := c.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t)})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "signing queue full")
	assert.Contains(t, status.Convert(err).Message(), "--sign-queue-size")
	assert.Contains(t, f.logs.String(), `"reason":"queue_full"`)
	assert.Equal(t, int64(1), f.signer.calls.Load(), "only the first reached the signer")

	close(release)
	require.NoError(t, <-first)
	require.NoError(t, <-second, "the waiting request is served")
	assert.Equal(t, int64(2), f.signer.calls.Load())
	assert.Zero(t, testutil.ToFloat64(f.svc.QueueWaitingForTest()))
	assert.Equal(t, 1.0, certRequests(t, f, codes.ResourceExhausted.String(), authn.MethodX509SVID))
}

// heldSigner signs with a once it has told entered and release is
// closed: a test holds the signing slot with it.
func heldSigner(a *ca.Authority, entered chan<- struct{}, release <-chan struct{}) certservice.Signer {
	return certservice.SignerFunc(func(p ca.X509SVIDParams) (*ca.Issued, error) {
		entered <- struct{}{}
		<-release
		return a.SignX509SVID(p)
	})
}

// createInBackground asks c for a certificate for a fresh key, and
// returns the call's outcome when it ends.
func createInBackground(t *testing.T, c securityv1alpha1.IstioCertificateServiceClient) <-chan error {
	out := make(chan error, 1)
	csr := freshCSR(t)
	go func() {
		_, err := c.CreateCertificate(context.Background(), &securityv1alpha1.IstioCertificateRequest{Csr: csr})
		out <- err
	}()
	return out
}

// Certificates, JWT-SVIDs and intermediates share the signing slots and
// the queue: while a certificate holds the only slot and a JWT-SVID
// waits in the queue of one, a JWT-SVID and an intermediate are refused
// as full; the waiting JWT-SVID is served once the slot is free.
func TestSigningPathsShareAdmission(t *testing.T) {
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	signer := newFakeJWTSigner(t)
	f := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.Intermediates = newFakeIntermediates(t)
		cfg.DownstreamAllow, cfg.TrustDomain = []spiffeid.ID{downstreamID}, td
		cfg.JWT = signer
		cfg.Concurrency, cfg.QueueSize = 1, 1
		cfg.Signer = heldSigner(a, entered, release)
	})
	queued := make(chan struct{}, 1)
	f.svc.OnQueuedForTest(func() { queued <- struct{}{} })
	cert := svid(t, f.authority, downstreamID)
	certDone := make(chan error, 1)
	go func() {
		_, err := f.client(t, cert, "").CreateCertificate(context.Background(), &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t, downstreamID.String())})
		certDone <- err
	}()
	<-entered
	ic := f.identityClient(t, cert, "")
	mint := &identityapi.MintJWTSVIDRequest{Audience: []string{"aud"}}
	jwtDone := make(chan error, 1)
	go func() {
		_, err := ic.MintJWTSVID(context.Background(), mint)
		jwtDone <- err
	}()
	<-queued

	_, err := ic.MintJWTSVID(t.Context(), mint)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "signing queue full")
	_, err = ic.SignIntermediate(t.Context(), &identityapi.SignIntermediateRequest{Csr: derCSR(t, "spiffe://example.org")})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "signing queue full")

	close(release)
	require.NoError(t, <-certDone)
	require.NoError(t, <-jwtDone)
	_, _, _, calls := signer.last()
	assert.Equal(t, 1, calls, "one JWT-SVID signed, the refused one never reached the signer")
	assert.Zero(t, testutil.ToFloat64(f.svc.QueueWaitingForTest()))
}

// Config.Authorized hears of a request once its caller passed every
// check, before it waits for a slot (the server confirms the connection
// then, not after a wait in a burst); never of a refused caller.
func TestAuthorizedBeforeWaiting(t *testing.T) {
	entered := make(chan struct{}, 2)
	release := make(chan struct{})
	authorized := make(chan struct{}, 4)
	f := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.Concurrency = 1
		cfg.RateLimit, cfg.RateBurst = rate.Every(time.Hour), 2
		cfg.Authorized = func(ctx context.Context) {
			_, ok := peer.FromContext(ctx)
			assert.True(t, ok, "the call's context, with its peer (whose connection the server confirms)")
			authorized <- struct{}{}
		}
		cfg.Signer = heldSigner(a, entered, release)
	})
	queued := make(chan struct{}, 1)
	f.svc.OnQueuedForTest(func() { queued <- struct{}{} })
	c := f.client(t, svid(t, f.authority, workloadID), "")
	call := func() <-chan error { return createInBackground(t, c) }
	first := call()
	<-entered
	<-authorized
	second := call()
	<-queued
	<-authorized // while it waits

	_, err := f.client(t, nil, "").CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t)})
	assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	_, err = c.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t)})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "rate limited: %v", err)
	close(release)
	require.NoError(t, <-first)
	require.NoError(t, <-second)
	assert.Empty(t, authorized, "refused callers were not heard of")
}

func TestCreateCertificateRateLimit(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	f := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.RateLimit = rate.Limit(1)
		cfg.Clock = clk
		cfg.Authenticator = authn.Chain{authn.NewX509SVID(td, localRoots{a}, nil), fakeTokens}
	})
	a := f.client(t, svid(t, f.authority, workloadID), "")
	b := f.client(t, nil, goodToken)
	call := func(c securityv1alpha1.IstioCertificateServiceClient) codes.Code {
		_, err := c.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t)})
		return status.Code(err)
	}
	assert.Equal(t, codes.OK, call(a))
	before := f.signer.calls.Load()
	assert.Equal(t, codes.ResourceExhausted, call(a), "second signing within a second")
	assert.Equal(t, before, f.signer.calls.Load())
	assert.Equal(t, codes.OK, call(b), "limits are per identity")
	clk.SetTime(clk.Now().Add(time.Second))
	assert.Equal(t, codes.OK, call(a), "a second later")
	assert.Contains(t, f.logs.String(), `"reason":"rate_limited"`)
}

func TestCreateCertificateMessageTooLarge(t *testing.T) {
	f := newFixture(t, nil)
	c := f.client(t, svid(t, f.authority, workloadID), "")
	_, err := c.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: strings.Repeat("A", certservice.MaxRecvMsgSize)})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Zero(t, f.signer.calls.Load())

	// Just over ca.MaxCSRSize still reaches the handler, which refuses it.
	_, err = c.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: strings.Repeat("A", ca.MaxCSRSize+1)})
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
}

// A server whose receive limit is raised for SDS (trustbridge server)
// still refuses certificate requests over MaxRecvMsgSize, before
// authentication or signing, and says why.
func TestCreateCertificateTooLargeUnderRaisedServerLimit(t *testing.T) {
	f := newFixture(t, nil, grpc.MaxRecvMsgSize(4*certservice.MaxRecvMsgSize))
	c := f.client(t, svid(t, f.authority, workloadID), "")
	_, err := c.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: strings.Repeat("A", certservice.MaxRecvMsgSize)})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Zero(t, f.signer.calls.Load())
	assert.Contains(t, f.logs.String(), `"reason":"too_large"`)
	assert.Equal(t, 1.0, certRequests(t, f, codes.ResourceExhausted.String(), "none"))
}

func TestCreateCertificateConcurrentClients(t *testing.T) {
	f := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.Authenticator = authn.Chain{authn.NewX509SVID(td, localRoots{a}, nil), fakeTokens}
	})
	const clients, calls = 24, 4
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		serials = map[string]bool{}
	)
	for i := range clients {
		id := spiffeid.RequireFromSegments(td, "client", string(rune('a'+i)))
		c := f.client(t, svid(t, f.authority, id), "")
		want := id
		if i%3 == 0 {
			c, want = f.client(t, nil, goodToken), tokenID
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls {
				resp, err := c.CreateCertificate(context.Background(), &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t)})
				if !assert.NoError(t, err) {
					return
				}
				chain := parseChain(t, resp.CertChain)
				got, _, err := x509svid.Verify(chain[:1], x509bundle.FromX509Authorities(td, chain[1:]))
				assert.NoError(t, err)
				assert.Equal(t, want, got)
				mu.Lock()
				serials[chain[0].SerialNumber.String()] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	assert.Len(t, serials, clients*calls)
}

func TestNewRefusesBadConfig(t *testing.T) {
	a := newAuthority(t, td)
	auth := authn.Chain{fakeTokens}
	for name, cfg := range map[string]certservice.Config{
		"no signer":         {Authenticator: auth},
		"no authenticator":  {Signer: a},
		"negative queue":    {Signer: a, Authenticator: auth, QueueSize: -1},
		"negative rate":     {Signer: a, Authenticator: auth, RateLimit: -1},
		"NaN rate":          {Signer: a, Authenticator: auth, RateLimit: rate.Limit(math.NaN())}, // would allow everything
		"negative burst":    {Signer: a, Authenticator: auth, RateBurst: -1},
		"negative limiters": {Signer: a, Authenticator: auth, MaxRateLimiters: -1},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := certservice.New(cfg)
			assert.ErrorContains(t, err, "certservice: ")
		})
	}
}

func TestServerStopsOnCancel(t *testing.T) {
	// newFixture's cleanup cancels and requires Run to return nil; a
	// client call in flight must not keep it from returning.
	f := newFixture(t, nil)
	c := f.client(t, svid(t, f.authority, workloadID), "")
	_, err := c.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t)})
	require.NoError(t, err)
}

// istioRootBundle is what Istio's agent cache makes of cert_chain when its
// CA client has no separate root fetch (the citadel client): the last
// element is the whole root bundle handed to Envoy as ROOTCA.
func istioRootBundle(tb testing.TB, chain []string) []*x509.Certificate {
	tb.Helper()
	require.NotEmpty(tb, chain)
	return parsePEMCerts(tb, chain[len(chain)-1])
}

// Issue 15: istiod's layout. A sidecar that takes the last element as its
// roots must hold every local root, above all during a rotation, when the
// successor is published before it signs: one element per root would
// leave it trusting only the newest, and dropping the root in use.
func TestCertChainIstioLayoutAcrossRotation(t *testing.T) {
	f := newFixture(t, nil)
	c := f.client(t, svid(t, f.authority, workloadID), "")
	ask := func() []string {
		resp, err := c.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t)})
		require.NoError(t, err)
		return resp.CertChain
	}
	before := ask()
	require.Len(t, before, 2)
	assert.Equal(t, f.authority.Bundle().X509Authorities(), istioRootBundle(t, before))

	require.NoError(t, prepareRoot(f.authority))
	published := f.authority.Bundle().X509Authorities()
	require.Len(t, published, 2, "the successor is published before it signs")
	during := ask()
	require.Len(t, during, 2)
	got := istioRootBundle(t, during)
	assert.ElementsMatch(t, published, got, "both roots, the one in use and the next")
	leaf := parseChain(t, during)[0]
	_, _, err := x509svid.Verify([]*x509.Certificate{leaf}, x509bundle.FromX509Authorities(td, got))
	assert.NoError(t, err, "the leaf verifies against the bundle Istio keeps")
}

// fakeImpersonator authorizes the caller allowed for target only.
type fakeImpersonator struct {
	allowed spiffeid.ID // the caller
	target  spiffeid.ID
	err     error // returned for anything else
}

func (f fakeImpersonator) AuthorizeImpersonation(_ context.Context, caller authn.Identity, target spiffeid.ID) error {
	if caller.ID == f.allowed && target == f.target {
		return nil
	}
	return f.err
}

// Istio's ImpersonatedIdentity (ztunnel asking for the pods of its node):
// signed for the target when the Impersonator authorizes the caller,
// refused otherwise, and the certificate cannot be renewed as the target.
func TestCreateCertificateImpersonation(t *testing.T) {
	node := spiffeid.RequireFromString("spiffe://example.org/ns/istio-system/sa/ztunnel")
	other := spiffeid.RequireFromString("spiffe://example.org/ns/istio-system/sa/other")
	target := spiffeid.RequireFromString("spiffe://example.org/ns/shop/sa/web")
	const nodeToken, otherToken = "node-token-0123456789", "other-token-0123456789"
	// Service account tokens as TokenReview proves them, grant included.
	tokens := authn.AuthenticatorFunc(func(_ context.Context, r authn.Request) (authn.Identity, error) {
		for token, id := range map[string]spiffeid.ID{nodeToken: node, otherToken: other} {
			if r.BearerToken == token {
				ns, sa := strings.Split(id.Path(), "/")[2], strings.Split(id.Path(), "/")[4]
				return authn.Identity{ID: id, Method: authn.MethodKubernetesJWT,
					Grant: &authn.Grant{Method: authn.MethodKubernetesJWT, Ref: ns + "/" + sa, UID: "uid-" + sa}}, nil
			}
		}
		return authn.Identity{}, fmt.Errorf("unknown token: %w", authn.ErrInvalidCredentials)
	})
	imp := fakeImpersonator{allowed: node, target: target, err: errors.New("not on this node")}
	f := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.Authenticator = authn.Chain{authn.NewX509SVID(td, localRoots{a}, nil), tokens}
		cfg.Impersonator = imp
	})
	ask := func(c securityv1alpha1.IstioCertificateServiceClient, who string, csrURIs ...string) (*securityv1alpha1.IstioCertificateResponse, error) {
		md, err := structpb.NewStruct(map[string]any{"ImpersonatedIdentity": who})
		require.NoError(t, err)
		return c.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t, csrURIs...), Metadata: md})
	}

	caller := f.client(t, nil, nodeToken)
	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(t, err)
	md, err := structpb.NewStruct(map[string]any{"ImpersonatedIdentity": target.String()})
	require.NoError(t, err)
	resp, err := caller.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: newCSR(t, key, target.String()), Metadata: md})
	require.NoError(t, err)
	leaf := parseChain(t, resp.CertChain)[0]
	got, _, err := x509svid.Verify([]*x509.Certificate{leaf}, f.authority.Bundle().X509Bundle())
	require.NoError(t, err)
	assert.Equal(t, target, got, "the certificate is for the impersonated workload")
	assert.Contains(t, f.logs.String(), `"impersonated_by":"`+node.String()+`"`)
	g, err := authn.GrantFromCert(leaf)
	require.NoError(t, err)
	assert.Equal(t, "istio-system/ztunnel", g.Ref, "the node proxy's grant, not the workload's")

	for name, tt := range map[string]struct {
		client securityv1alpha1.IstioCertificateServiceClient
		who    string
		code   codes.Code
		msg    string
	}{
		"another target":      {caller, "spiffe://example.org/ns/shop/sa/api", codes.PermissionDenied, "not on this node"},
		"an unauthorized one": {f.client(t, nil, otherToken), target.String(), codes.PermissionDenied, "may not have a certificate"},
		"a certificate":       {f.client(t, svid(t, f.authority, node), ""), target.String(), codes.PermissionDenied, "not a certificate"},
		"not a SPIFFE ID":     {caller, "web", codes.InvalidArgument, "not a SPIFFE ID"},
		"a trust domain only": {caller, "spiffe://example.org", codes.InvalidArgument, "not a SPIFFE ID of a workload"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ask(tt.client, tt.who)
			assert.Equal(t, tt.code, status.Code(err), "%v", err)
			assert.ErrorContains(t, err, tt.msg)
		})
	}

	// The CSR must name the impersonated identity, if any.
	_, err = ask(caller, target.String(), node.String())
	assert.Equal(t, codes.PermissionDenied, status.Code(err))

	// A backend that cannot decide yet: retry.
	busy := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.Authenticator = tokens
		cfg.Impersonator = fakeImpersonator{err: fmt.Errorf("pods not listed yet: %w", authn.ErrUnavailable)}
	})
	_, err = ask(busy.client(t, nil, nodeToken), target.String())
	assert.Equal(t, codes.Unavailable, status.Code(err))
}

// prepareRoot publishes a successor root now, as `ca authority prepare`
// does (a no-op while one waits).
func prepareRoot(a *ca.Authority) error {
	_, err := a.ChangeAuthority(ca.AuthorityChange{Action: "prepare"})
	return err
}
