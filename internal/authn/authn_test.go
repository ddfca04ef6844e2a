package authn

import (
	"context"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func fixed(id Identity, err error) Authenticator {
	return AuthenticatorFunc(func(context.Context, Request) (Identity, error) { return id, err })
}

func TestChain(t *testing.T) {
	web := Identity{ID: workloadID, Method: MethodX509SVID}
	db := Identity{ID: spiffeid.RequireFromString("spiffe://example.org/db"), Method: MethodKubernetesJWT}
	none := fixed(Identity{}, noCredentials("a", "nothing here"))
	bad := fixed(Identity{}, invalidf("b", "signature mismatch"))
	down := fixed(Identity{}, fmt.Errorf("authn: c: token review: connection refused: %w", ErrUnavailable))
	neverCalled := AuthenticatorFunc(func(context.Context, Request) (Identity, error) {
		t.Error("authenticator after a success was called")
		return Identity{}, nil
	})

	tests := []struct {
		name     string
		chain    Chain
		want     Identity
		wantErrs []error
		msg      string
	}{
		{name: "first success decides", chain: Chain{fixed(web, nil), neverCalled}, want: web},
		{name: "failures then success", chain: Chain{none, bad, fixed(db, nil), neverCalled}, want: db},
		{
			name: "all fail", chain: Chain{none, bad},
			wantErrs: []error{ErrUnauthenticated, ErrNoCredentials, ErrInvalidCredentials},
			msg:      "authn: unauthenticated: a: nothing here: no credentials; b: signature mismatch: invalid credentials",
		},
		{name: "unavailable is visible", chain: Chain{none, down}, wantErrs: []error{ErrUnauthenticated, ErrUnavailable}},
		{name: "empty chain fails closed", chain: Chain{}, wantErrs: []error{ErrUnauthenticated}, msg: "authn: unauthenticated: no authenticators configured"},
		{name: "nil chain fails closed", wantErrs: []error{ErrUnauthenticated}},
		{
			name: "empty identity counts as failure", chain: Chain{fixed(Identity{Method: "x"}, nil)},
			wantErrs: []error{ErrUnauthenticated}, msg: "returned an empty identity",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := tt.chain.Authenticate(context.Background(), Request{})
			if tt.wantErrs == nil {
				require.NoError(t, err)
				assert.Equal(t, tt.want, id)
				return
			}
			require.Error(t, err)
			assert.Zero(t, id)
			for _, want := range tt.wantErrs {
				assert.ErrorIs(t, err, want)
			}
			var ce *ChainError
			require.ErrorAs(t, err, &ce)
			assert.Contains(t, err.Error(), tt.msg)
		})
	}
	t.Run("unavailable absent when not reported", func(t *testing.T) {
		_, err := Chain{none, bad}.Authenticate(context.Background(), Request{})
		assert.NotErrorIs(t, err, ErrUnavailable)
	})
}

func TestChainStopsOnCancelledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	_, err := Chain{AuthenticatorFunc(func(context.Context, Request) (Identity, error) {
		called = true
		return Identity{ID: workloadID}, nil
	})}.Authenticate(ctx, Request{})
	require.ErrorIs(t, err, ErrUnauthenticated)
	require.ErrorIs(t, err, context.Canceled)
	assert.False(t, called)
}

// TestChainAllAuthenticators wires the three authenticators in the order the
// certificate service uses and checks who decides for each kind of caller,
// and that a bootstrap token never reaches the API server.
func TestChainAllAuthenticators(t *testing.T) {
	local := testca.New(t, "example.org")
	leaf, _ := local.Issue(t, workloadID)
	federated := testca.New(t, "other.org")
	fedLeaf, _ := federated.Issue(t, spiffeid.RequireFromString("spiffe://other.org/w"))

	f := newReviewFixture(t, nil)
	kubeTok := saToken(t, "web", epoch.Add(time.Hour))
	f.api.set(kubeTok, accept("system:serviceaccount:default:web", "example.org"))

	path := filepath.Join(t.TempDir(), "tokens.csv")
	writeTokens(t, path, tokLaptop+",spiffe://example.org/laptop/alice\n", 0o600)
	boot, err := LoadBootstrapTokens(path, localTD)
	require.NoError(t, err)

	chain := Chain{NewX509SVID(localTD, local.Bundle(), nil), f.a, boot}
	kubeID := spiffeid.RequireFromString("spiffe://example.org/ns/default/sa/web")
	tests := []struct {
		name    string
		req     Request
		want    Identity
		wantErr []error
		apiSeen int32
	}{
		{name: "SVID", req: Request{PeerCertificates: []*x509.Certificate{leaf}}, want: Identity{ID: workloadID, Method: MethodX509SVID}},
		{name: "SVID wins over a bad token", req: Request{PeerCertificates: []*x509.Certificate{leaf}, BearerToken: "garbage-garbage-garbage"}, want: Identity{ID: workloadID, Method: MethodX509SVID}},
		{name: "federated SVID, kube token", req: Request{PeerCertificates: []*x509.Certificate{fedLeaf}, BearerToken: kubeTok}, want: Identity{ID: kubeID, Method: MethodKubernetesJWT}, apiSeen: 1},
		{name: "bootstrap token", req: Request{BearerToken: tokLaptop}, want: Identity{ID: laptopID, Method: MethodBootstrapToken}},
		{name: "nothing", wantErr: []error{ErrUnauthenticated, ErrNoCredentials}},
		{name: "unknown opaque token", req: Request{BearerToken: "garbage-garbage-garbage"}, wantErr: []error{ErrUnauthenticated, ErrInvalidCredentials}},
		{name: "two authorization values", req: Request{AuthorizationError: fmt.Errorf("authorization metadata has 2 values, want one")}, wantErr: []error{ErrUnauthenticated, ErrInvalidCredentials}},
		{name: "federated SVID only", req: Request{PeerCertificates: []*x509.Certificate{fedLeaf}}, wantErr: []error{ErrUnauthenticated, ErrInvalidCredentials}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.api.calls.Store(0)
			id, err := chain.Authenticate(context.Background(), tt.req)
			assert.Equal(t, tt.apiSeen, f.api.calls.Load(), "TokenReview calls")
			if tt.wantErr != nil {
				for _, want := range tt.wantErr {
					require.ErrorIs(t, err, want)
				}
				for _, m := range []string{"x509-svid: ", "kubernetes-jwt: ", "bootstrap-token: "} {
					assert.Contains(t, err.Error(), m, "each authenticator's reason is listed")
				}
				if tt.req.BearerToken != "" {
					assert.NotContains(t, err.Error(), tt.req.BearerToken)
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, idOnly(id))
		})
	}
}
