package certservice_test

import (
	"context"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
)

// issuerBound stands in for oidc.Authenticator as the checker of issuer
// grants: every grant stands, and its certificates end bound after it.
type issuerBound struct{ bound time.Duration }

func (issuerBound) CheckGrant(context.Context, spiffeid.ID, authn.Grant) error { return nil }

func (b issuerBound) GrantNotAfter(g authn.Grant) (time.Time, bool) {
	return g.GrantedAt.Add(b.bound), true
}

const ciToken = "ci-token-0123456789abcdef"

var ciGrant = authn.Grant{Method: authn.MethodOIDC, Ref: "ci", UID: authn.IssuerGrantUID("https://ci.example")}

// newBoundFixture is a service whose token ciToken proves workloadID with
// an issuer grant bounded to 2 hours, and whose default TTL is def.
func newBoundFixture(t *testing.T, def time.Duration) *fixture {
	t.Helper()
	tokens := authn.AuthenticatorFunc(func(_ context.Context, r authn.Request) (authn.Identity, error) {
		if r.BearerToken != ciToken {
			return authn.Identity{}, authn.ErrNoCredentials
		}
		g := ciGrant
		return authn.Identity{ID: workloadID, Method: authn.MethodOIDC, Grant: &g}, nil
	})
	return newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.Authenticator = authn.Chain{authn.NewX509SVID(td, localRoots{a}, nil), tokens}
		cfg.Grants = map[string]authn.GrantChecker{authn.MethodOIDC: issuerBound{2 * time.Hour}}
		cfg.DefaultTTL = def
	})
}

// A certificate of an issuer grant ends by the issuer's bound after the
// token, whatever TTL was asked for: the claims the token carried are not
// re-checked later, so nothing it bought outlives that bound. A shorter
// request, or a shorter default, is kept.
func TestIssuerGrantBoundsCertificateLife(t *testing.T) {
	for _, tc := range []struct {
		name     string
		def, ask time.Duration
		want     time.Duration
	}{
		{"long request shortened", 24 * time.Hour, 30 * 24 * time.Hour, 2 * time.Hour},
		{"default shortened", 24 * time.Hour, 0, 2 * time.Hour},
		{"shorter default kept", time.Hour, 0, time.Hour},
		{"shorter request kept", 24 * time.Hour, 30 * time.Minute, 30 * time.Minute},
		{"no default known: the time left", 0, 0, 2 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newBoundFixture(t, tc.def)
			key, err := ca.GenerateKey(ca.KeyECP256)
			require.NoError(t, err)
			before := time.Now()
			resp, err := f.client(t, nil, ciToken).CreateCertificate(t.Context(),
				&securityv1alpha1.IstioCertificateRequest{Csr: newCSR(t, key), ValidityDuration: int64(tc.ask.Seconds())})
			require.NoError(t, err)
			leaf := parseChain(t, resp.CertChain)[0]
			assert.WithinDuration(t, before.Add(tc.want), leaf.NotAfter, 5*time.Second)
		})
	}
}

// A renewal near the end of the bound gets only the time left; at the
// end, none.
func TestIssuerGrantBoundsRenewals(t *testing.T) {
	f := newBoundFixture(t, 24*time.Hour)
	g := ciGrant
	g.GrantedAt = time.Now().Add(-2*time.Hour + 10*time.Minute)
	before := time.Now()
	renewed, err := request(t, f.client(t, grantedSVID(t, f.authority, workloadID, grantExt(t, g)), ""))
	require.NoError(t, err)
	assert.WithinDuration(t, g.GrantedAt.Add(2*time.Hour), renewed.Leaf.NotAfter, 5*time.Second)
	assert.True(t, renewed.Leaf.NotAfter.Before(before.Add(11*time.Minute)))

	g.GrantedAt = time.Now().Add(-2 * time.Hour)
	_, err = request(t, f.client(t, grantedSVID(t, f.authority, workloadID, grantExt(t, g)), ""))
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	assert.ErrorContains(t, err, `by token issuer "ci", longer ago than that issuer's maxRenewalLifetime allows`)
}
