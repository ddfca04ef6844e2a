package ca

import (
	"crypto/x509/pkix"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// SignX509SVID applies to a public key every check the CSR path applies:
// key strength, identity, TTL, DNS names and extensions.
func TestAuthoritySignX509SVID(t *testing.T) {
	a, err := New(testConfig(t, clocktesting.NewFakeClock(t0)))
	require.NoError(t, err)
	id := spiffeid.RequireFromPath(tdExample, "/ns/prod/sa/web")
	key, err := GenerateKey(KeyECP256)
	require.NoError(t, err)

	res, err := a.SignX509SVID(X509SVIDParams{PublicKey: key.Public(), SPIFFEID: id, DNSNames: []string{"web.prod.svc"}})
	require.NoError(t, err)
	assert.Equal(t, id.String(), res.Leaf.URIs[0].String())
	assert.Equal(t, []string{"web.prod.svc"}, res.Leaf.DNSNames)
	assert.True(t, publicKeysMatch(key.Public(), res.Leaf.PublicKey))
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.signings.WithLabelValues("ok")))

	for name, tt := range map[string]struct {
		p    X509SVIDParams
		want error
		msg  string
	}{
		"no key":        {X509SVIDParams{SPIFFEID: id}, ErrInvalidCSR, "no public key"},
		"weak key":      {X509SVIDParams{PublicKey: testca.NewKey(t, testca.RSA1024).Public(), SPIFFEID: id}, ErrInvalidCSR, ""},
		"other domain":  {X509SVIDParams{PublicKey: key.Public(), SPIFFEID: spiffeid.RequireFromPath(spiffeid.RequireTrustDomainFromString("other.test"), "/x")}, ErrIdentityNotAllowed, ""},
		"no path":       {X509SVIDParams{PublicKey: key.Public(), SPIFFEID: tdExample.ID()}, ErrIdentityNotAllowed, ""},
		"over max TTL":  {X509SVIDParams{PublicKey: key.Public(), SPIFFEID: id, TTL: defaultMaxWorkloadTTL + time.Second}, ErrInvalidTTL, ""},
		"wildcard name": {X509SVIDParams{PublicKey: key.Public(), SPIFFEID: id, DNSNames: []string{"*.prod.svc"}}, nil, "wildcards are not issued"},
		"critical ext":  {X509SVIDParams{PublicKey: key.Public(), SPIFFEID: id, Extensions: []pkix.Extension{{Id: []int{1, 3, 6, 1, 4, 1, 9}, Critical: true}}}, nil, "is critical"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := a.SignX509SVID(tt.p)
			require.Error(t, err)
			if tt.want != nil {
				assert.ErrorIs(t, err, tt.want)
			}
			if tt.msg != "" {
				assert.ErrorContains(t, err, tt.msg)
			}
		})
	}
}
