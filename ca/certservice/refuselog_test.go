package certservice_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/identityapi"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
)

// A flood of calls refused because the authenticators are busy (issue 14
// item 3: 11,419 ERROR lines in 8 s) logs a burst of warnings and the rest
// at Debug, never an Error per call; every refusal is still counted.
func TestRefusalLogsAreBounded(t *testing.T) {
	f := newFixture(t, func(cfg *certservice.Config, _ *ca.Authority) {
		cfg.Authenticator = authn.AuthenticatorFunc(func(context.Context, authn.Request) (authn.Identity, error) {
			return authn.Identity{}, authn.ErrUnavailable
		})
	})
	c := f.client(t, nil, "")
	const n = 40
	for range n {
		_, err := c.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t)})
		assert.Equal(t, codes.Unavailable, status.Code(err))
	}
	logs := f.logs.String()
	warns := strings.Count(logs, `"level":"WARN","msg":"certificate request refused"`)
	debugs := strings.Count(logs, `"level":"DEBUG","msg":"certificate request refused"`)
	assert.Zero(t, strings.Count(logs, `"level":"ERROR"`))
	assert.LessOrEqual(t, warns, ratelimit.DefaultLogBurst+1, "a burst, then about one a second")
	assert.Equal(t, n, warns+debugs, "every refusal logged at some level")
}

// Refusals of callers that proved who they are (a revoked grant, a
// forbidden request) keep their own log budget: a flood of junk from
// others, which spends the unauthenticated budget, does not push them to
// Debug.
func TestAuthenticatedRefusalsKeepTheirLogBudget(t *testing.T) {
	f := newFixture(t, func(cfg *certservice.Config, _ *ca.Authority) {
		cfg.Authenticator = authn.AuthenticatorFunc(func(_ context.Context, r authn.Request) (authn.Identity, error) {
			if r.BearerToken == "good-token-0123456789" {
				return authn.Identity{ID: spiffeid.RequireFromString("spiffe://example.org/ns/default/sa/web"), Method: authn.MethodBootstrapToken}, nil
			}
			return authn.Identity{}, authn.ErrInvalidCredentials
		})
	})
	junk := f.client(t, nil, "junk-token-0123456789")
	for range 40 {
		_, err := junk.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t)})
		assert.Equal(t, codes.Unauthenticated, status.Code(err))
	}
	md, err := structpb.NewStruct(map[string]any{"ImpersonatedIdentity": "spiffe://example.org/ns/default/sa/other"})
	require.NoError(t, err)
	_, err = f.client(t, nil, "good-token-0123456789").CreateCertificate(t.Context(),
		&securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t), Metadata: md})
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.Equal(t, 1, strings.Count(f.logs.String(), `"level":"INFO","msg":"certificate request refused","reason":"impersonation"`))
}

// A CA that cannot sign refuses every MintJWTSVID: one Error line an
// interval says so, the rest go to Debug, and the metric counts them all.
func TestSigningMaterialErrorsAreBounded(t *testing.T) {
	f, signer := jwtFixture(t, nil)
	f.svc.SetFaultLogForTest(ratelimit.NewLogLimiter(0, 1)) // one line, however long the test runs
	signer.set(fmt.Errorf("ca: %w", ca.ErrInvalidSigningMaterial))
	c := f.identityClient(t, nil, goodToken)
	const n = 5
	for range n {
		_, err := c.MintJWTSVID(t.Context(), &identityapi.MintJWTSVIDRequest{Audience: []string{"aud"}})
		assert.Equal(t, codes.Unavailable, status.Code(err))
	}
	logs := f.logs.String()
	assert.Equal(t, 1, strings.Count(logs, `"level":"ERROR","msg":"jwt-svid request refused","reason":"signing_material"`))
	assert.Equal(t, n-1, strings.Count(logs, `"level":"DEBUG","msg":"jwt-svid request refused","reason":"signing_material"`))
	assert.Equal(t, float64(n), testutil.ToFloat64(f.svc.JWTSVIDsForTest("Unavailable", "fake-token")))
}
