package certservice_test

import (
	"context"
	"crypto/tls"
	"crypto/x509/pkix"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/catest"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// fakeAccounts decides Kubernetes grants as authn.ServiceAccountGrants
// does: the account "<namespace>/<name>" must exist with the grant's UID.
// down makes every answer ErrUnavailable (the API server not answering).
type fakeAccounts struct {
	mu   sync.Mutex
	uids map[string]string
	down bool
}

func newFakeAccounts() *fakeAccounts {
	return &fakeAccounts{uids: map[string]string{"default/web": "uid-1"}}
}

func (a *fakeAccounts) CheckGrant(_ context.Context, id spiffeid.ID, g authn.Grant) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	uid, ok := a.uids[g.Ref]
	switch {
	case a.down:
		return fmt.Errorf("fake accounts: not listed yet: %w", authn.ErrUnavailable)
	case !ok:
		return fmt.Errorf("fake accounts: service account %s of %s deleted: %w", g.Ref, id, authn.ErrGrantRevoked)
	case uid != g.UID:
		return fmt.Errorf("fake accounts: service account %s of %s re-created (uid %s, granted %s): %w", g.Ref, id, uid, g.UID, authn.ErrGrantRevoked)
	}
	return nil
}

func (a *fakeAccounts) set(f func(a *fakeAccounts)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(a)
}

// identityGrantFixture is a grantFixture serving the whole identity
// service too (JWT-SVIDs, bundle streams, intermediates for downstreamID
// and bootID), its Kubernetes grants decided by accounts.
type identityGrantFixture struct {
	*grantFixture
	accounts      *fakeAccounts
	jwt           *fakeJWTSigner
	intermediates *fakeIntermediates
}

// grantCheckLifetime is the fixture's --max-renewal-lifetime: shorter
// than the test certificates' hour, so a chain ends by it while its
// certificate is still valid, and nothing else refuses it.
const grantCheckLifetime = 30 * time.Minute

// newIdentityGrantFixture starts an identityGrantFixture. Its CA signs
// intermediates, as a server with --downstream-allow does, so that a
// downstream's intermediate of ours verifies against its roots.
func newIdentityGrantFixture(t *testing.T) *identityGrantFixture {
	t.Helper()
	f := &identityGrantFixture{accounts: newFakeAccounts(), jwt: newFakeJWTSigner(t), intermediates: newFakeIntermediates(t)}
	f.grantFixture = newGrantFixtureOn(t, newDownstreamAuthority(t), grantCheckLifetime, f.accounts, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.JWT = f.jwt
		cfg.Bundles = newFakeBundles(a.Bundle())
		cfg.Intermediates = f.intermediates
		cfg.DownstreamAllow = []spiffeid.ID{downstreamID, bootID}
		cfg.TrustDomain = td
	})
	return f
}

// signed is what the fixture's signers have signed so far: certificates,
// JWT-SVIDs, intermediates.
func (f *identityGrantFixture) signed() [3]int64 {
	_, _, _, jwts := f.jwt.last()
	intermediates, _ := f.intermediates.state()
	return [3]int64{f.signer.calls.Load(), int64(jwts), int64(intermediates)}
}

// A grantFailure is one way the grant behind an X509-SVID stops standing,
// or cannot be judged.
type grantFailure struct {
	name string
	// cert is the caller's certificate, bought while its grant stood
	// (unless it never did).
	cert func(t *testing.T, f *identityGrantFixture) *tls.Certificate
	// fall ends the grant; nil when it never stood. age is then the
	// fake clock's step.
	fall func(t *testing.T, f *identityGrantFixture)
	age  time.Duration
	// log is in the refusal's log line: the grant's fault, not another.
	log string
	// unavailable: the grant cannot be checked right now, so the caller
	// is told to retry, and is never served.
	unavailable bool
}

// kubeSVID is an SVID of downstreamID granted by the service account
// default/web (uid-1) at the fixture's start.
func kubeSVID(t *testing.T, f *identityGrantFixture) *tls.Certificate {
	return grantedSVID(t, f.authority, downstreamID, grantExt(t, authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "default/web", UID: "uid-1", GrantedAt: f.start}))
}

// grantFailures are every failure kind: the revoked grants (a bootstrap
// token removed, a service account deleted or re-created), a chain
// older than --max-renewal-lifetime, a certificate SDS minted for Envoy,
// a grant record that does not parse, a grant kind this server no longer
// accepts, a leaf a downstream minted under its intermediate of ours (of
// another identity, or of its own), and a grant the server cannot check
// right now.
func grantFailures() []grantFailure {
	return []grantFailure{
		{
			name: "bootstrap token removed",
			cert: func(t *testing.T, f *identityGrantFixture) *tls.Certificate {
				c, err := request(t, f.client(t, nil, bootstrapToken))
				require.NoError(t, err)
				return c
			},
			fall: func(t *testing.T, f *identityGrantFixture) {
				require.NoError(t, os.WriteFile(f.path, []byte("# emptied\n"), 0o600))
				require.NoError(t, f.boot.Reload())
			},
			log: "is no longer listed in",
		},
		{
			name: "service account deleted",
			cert: kubeSVID,
			fall: func(t *testing.T, f *identityGrantFixture) {
				f.accounts.set(func(a *fakeAccounts) { delete(a.uids, "default/web") })
			},
			log: "service account default/web of " + downstreamID.String() + " deleted",
		},
		{
			name: "service account re-created",
			cert: kubeSVID,
			fall: func(t *testing.T, f *identityGrantFixture) {
				f.accounts.set(func(a *fakeAccounts) { a.uids["default/web"] = "uid-2" })
			},
			log: "re-created (uid uid-2, granted uid-1)",
		},
		{
			name: "chain older than the maximum renewal lifetime",
			cert: kubeSVID,
			fall: func(*testing.T, *identityGrantFixture) {},
			age:  grantCheckLifetime + time.Second,
			log:  authn.ErrGrantExpired.Error(),
		},
		{
			name: "certificate minted by SDS",
			cert: func(t *testing.T, f *identityGrantFixture) *tls.Certificate {
				return grantedSVID(t, f.authority, downstreamID, grantExt(t, authn.Grant{Method: authn.GrantMethodSDS, GrantedAt: f.start}))
			},
			log: "minted by SDS for Envoy",
		},
		{
			name: "grant record does not parse",
			cert: func(t *testing.T, f *identityGrantFixture) *tls.Certificate {
				return grantedSVID(t, f.authority, downstreamID, pkix.Extension{Id: authn.GrantOID, Value: []byte{0x30, 0x00}})
			},
			log: authn.ErrGrantUnreadable.Error(),
		},
		{
			name: "granted by a kind of credential no longer accepted",
			cert: func(t *testing.T, f *identityGrantFixture) *tls.Certificate {
				// The fixture checks bootstrap and Kubernetes grants only.
				g := authn.Grant{Method: authn.MethodKubernetesIssuer, Ref: "remote", UID: authn.IssuerGrantUID("https://remote.example"), GrantedAt: f.start}
				return grantedSVID(t, f.authority, downstreamID, grantExt(t, g))
			},
			log: "which this server no longer accepts",
		},
		{
			// Issue 32's sequel: a downstream mints a leaf of another
			// identity with a grant the checker would accept.
			name: "leaf minted by a downstream's intermediate",
			cert: func(t *testing.T, f *identityGrantFixture) *tls.Certificate {
				return downstreamLeaf(t, newDownstreamCA(t, f.authority), paymentsID,
					grantExt(t, authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "default/web", UID: "uid-1", GrantedAt: f.clk.Now()}))
			},
			log: authn.ErrNotIssuedHere.Error(),
		},
		{
			// docs/upstream-trustbridge.md's headline: the downstream
			// mints, under the intermediate it was given, an SVID of its
			// own --downstream-allow ID with a forged grant, to buy
			// intermediates after its removal from the list.
			name: "own ID minted by the downstream's intermediate",
			cert: func(t *testing.T, f *identityGrantFixture) *tls.Certificate {
				return downstreamLeaf(t, newDownstreamCA(t, f.authority), downstreamID,
					grantExt(t, authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "default/web", UID: "uid-1", GrantedAt: f.clk.Now()}))
			},
			log: authn.ErrNotIssuedHere.Error(),
		},
		{
			name: "service accounts not listed yet",
			cert: kubeSVID,
			fall: func(t *testing.T, f *identityGrantFixture) {
				f.accounts.set(func(a *fakeAccounts) { a.down = true })
			},
			log:         "not listed yet",
			unavailable: true,
		},
	}
}

// grantedRPCs has a row for every RPC the certificate service registers
// (catest.CertServiceRPCs). A new RPC needs one: decide how it
// authenticates, and make it refuse a certificate whose grant no longer
// stands, as every RPC here does.
var grantedRPCs = catest.CertServiceRPCs(func(tb testing.TB) string { return freshCSR(tb) },
	func(tb testing.TB) []byte { return derCSR(tb, "spiffe://example.org") })

// registeredRPCs are the full method names of every RPC of every service
// Register adds to a gRPC server, the identity service included.
func registeredRPCs(t *testing.T, svc *certservice.Service) []string {
	t.Helper()
	gs := grpc.NewServer()
	t.Cleanup(gs.Stop)
	svc.Register(gs)
	var out []string
	for name, info := range gs.GetServiceInfo() {
		for _, m := range info.Methods {
			out = append(out, "/"+name+"/"+m.Name)
		}
	}
	slices.Sort(out)
	return out
}

// TestEveryRPCRefusesAFallenGrant: every RPC the certificate service
// registers refuses a caller whose grant no longer stands, for every way
// a grant falls, and signs nothing for it; the same certificate was
// served by each while its grant stood. An RPC without a row in
// grantedRPCs fails the test.
func TestEveryRPCRefusesAFallenGrant(t *testing.T) {
	registered := registeredRPCs(t, newIdentityGrantFixture(t).svc)
	for _, m := range registered {
		if _, ok := grantedRPCs[m]; !ok {
			t.Fatalf("%s has no row in grantedRPCs: decide how it authenticates, and refuse a certificate whose grant no longer stands", m)
		}
	}
	for m := range grantedRPCs {
		assert.Contains(t, registered, m, "a row for an RPC that is no longer registered")
	}
	for _, fail := range grantFailures() {
		t.Run(fail.name, func(t *testing.T) {
			f := newIdentityGrantFixture(t)
			cert := fail.cert(t, f)
			conn := f.conn(t, f.tlsConfig(cert), "")
			if fail.fall != nil {
				for _, m := range registered {
					require.NoError(t, grantedRPCs[m].Call(t, conn), "%s while the grant stands", m)
				}
				fail.fall(t, f)
				f.clk.Step(fail.age)
			}
			signed := f.signed()
			for _, m := range registered {
				rpc := grantedRPCs[m]
				want := rpc.Refused
				if fail.unavailable {
					want = codes.Unavailable
				}
				logged := strings.Count(f.logs.String(), fail.log)
				err := rpc.Call(t, conn)
				assert.Equal(t, want, status.Code(err), "%s: %v", m, err)
				assert.Greater(t, strings.Count(f.logs.String(), fail.log), logged, "%s: the refusal logs the grant's fault", m)
			}
			assert.Equal(t, signed, f.signed(), "nothing signed")
		})
	}
}

// TestSignIntermediateGrantRefused is the regression test of issue 32:
// SignIntermediate authenticated with the certificate service's own
// authenticators, which do not judge grants, so a certificate refused
// for renewal and for JWT-SVIDs still bought a CA for the whole trust
// domain. Each way a grant falls now refuses it, counted and logged.
func TestSignIntermediateGrantRefused(t *testing.T) {
	for _, fail := range grantFailures() {
		t.Run(fail.name, func(t *testing.T) {
			f := newIdentityGrantFixture(t)
			cert := fail.cert(t, f)
			if fail.fall != nil {
				fail.fall(t, f)
				f.clk.Step(fail.age)
			}
			want := codes.Unauthenticated
			if fail.unavailable {
				want = codes.Unavailable
			}
			_, err := f.identityClient(t, cert, "").SignIntermediate(t.Context(),
				&identityapi.SignIntermediateRequest{Csr: derCSR(t, "spiffe://example.org")})
			require.Equal(t, want, status.Code(err), "%v", err)
			calls, _ := f.intermediates.state()
			assert.Zero(t, calls, "the signer must not be reached")
			assert.Equal(t, 1.0, testutil.ToFloat64(f.svc.IntermediatesForTest(want.String(), "none")))
			assert.Zero(t, testutil.ToFloat64(f.svc.IntermediatesForTest(codes.OK.String(), authn.MethodX509SVID)))
			logs := f.logs.String()
			assert.Contains(t, logs, `"msg":"intermediate request refused"`)
			assert.Contains(t, logs, fail.log)
			assert.NotContains(t, logs, `"msg":"intermediate issued"`)
		})
	}
}

// A downstream whose grant stands still gets its intermediate: a
// bootstrap token's certificate and its renewal, a service account's
// certificate, one within the maximum renewal lifetime.
func TestSignIntermediateGrantStands(t *testing.T) {
	f := newIdentityGrantFixture(t)
	first, err := request(t, f.client(t, nil, bootstrapToken))
	require.NoError(t, err)
	renewed, err := request(t, f.client(t, first, ""))
	require.NoError(t, err)
	kube := kubeSVID(t, f)
	f.clk.Step(grantCheckLifetime - time.Second)
	for _, cert := range []*tls.Certificate{first, renewed, kube} {
		resp, err := f.identityClient(t, cert, "").SignIntermediate(t.Context(),
			&identityapi.SignIntermediateRequest{Csr: derCSR(t, "spiffe://example.org")})
		require.NoError(t, err)
		assert.Len(t, resp.GetCertChain(), 1)
	}
	assert.Equal(t, 3.0, testutil.ToFloat64(f.svc.IntermediatesForTest(codes.OK.String(), authn.MethodX509SVID)))
}
