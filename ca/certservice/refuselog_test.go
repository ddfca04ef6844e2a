package certservice_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/loglimit"
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
	assert.LessOrEqual(t, warns, loglimit.DefaultBurst+1, "a burst, then about one a second")
	assert.Equal(t, n, warns+debugs, "every refusal logged at some level")
}
