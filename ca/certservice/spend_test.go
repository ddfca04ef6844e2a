package certservice_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
)

const (
	reusableToken = "reusable-token-abcdefghijklmnop"
	expiredToken  = "expired-token-abcdefghijklmnopq"
)

// singleUseAuth is a bootstrap token file with a single-use, a reusable
// and an expired token on ledger, as the server's only authenticator.
func singleUseAuth(t *testing.T, ledger authn.TokenLedger) func(*certservice.Config, *ca.Authority) {
	return func(cfg *certservice.Config, _ *ca.Authority) {
		p := filepath.Join(t.TempDir(), "tokens.csv")
		require.NoError(t, os.WriteFile(p, []byte(bootstrapToken+","+bootID.String()+"\n"+
			reusableToken+","+bootID.String()+",reusable\n"+
			expiredToken+","+bootID.String()+",expires=2020-01-01T00:00:00Z\n"), 0o600))
		boot, err := authn.NewBootstrapTokens(authn.BootstrapTokensConfig{Path: p, TrustDomain: td, Ledger: ledger, Registerer: prometheus.NewRegistry()})
		require.NoError(t, err)
		cfg.Authenticator = authn.Chain{boot}
	}
}

func createCert(t *testing.T, c securityv1alpha1.IstioCertificateServiceClient, csr string) (*securityv1alpha1.IstioCertificateResponse, error) {
	t.Helper()
	return c.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
}

// TestCreateCertificateSingleUseToken: refused requests do not consume the
// token; the first certificate does; a second use is Unauthenticated with
// a message saying why, and so is an expired token; a reusable one works
// every time.
func TestCreateCertificateSingleUseToken(t *testing.T) {
	ledger := authn.NewMemoryLedger()
	f := newFixture(t, singleUseAuth(t, ledger))
	c := f.client(t, nil, bootstrapToken)

	// Refused after authentication: nothing bought, nothing consumed.
	_, err := createCert(t, c, freshCSR(t, "spiffe://example.org/vm/other"))
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	_, err = createCert(t, c, "not a CSR")
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)

	resp, err := createCert(t, c, freshCSR(t, bootID.String()))
	require.NoError(t, err, "the token is still good after refused requests")
	chain := parseChain(t, resp.CertChain)
	id, _, err := x509svid.Verify(chain[:1], f.authority.Bundle().X509Bundle())
	require.NoError(t, err)
	assert.Equal(t, bootID, id)

	_, err = createCert(t, c, freshCSR(t, bootID.String()))
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "already used")
	assert.Contains(t, f.logs.String(), `"reason":"token_consumed"`)
	assert.NotContains(t, f.logs.String(), bootstrapToken)

	_, err = createCert(t, f.client(t, nil, expiredToken), freshCSR(t, bootID.String()))
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "expired")
	assert.Contains(t, f.logs.String(), `"reason":"token_expired"`)

	for range 3 {
		_, err := createCert(t, f.client(t, nil, reusableToken), freshCSR(t, bootID.String()))
		require.NoError(t, err)
	}
	assert.Equal(t, 2.0, certRequests(t, f, codes.Unauthenticated.String(), "none"))
	assert.Equal(t, 4.0, certRequests(t, f, codes.OK.String(), authn.MethodBootstrapToken))
}

// TestCreateCertificateSingleUseTokenSignerFails: a signing failure does
// not consume the token.
func TestCreateCertificateSingleUseTokenSignerFails(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	f := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		singleUseAuth(t, authn.NewMemoryLedger())(cfg, a)
		cfg.Signer = certservice.SignerFunc(func(p ca.X509SVIDParams) (*ca.Issued, error) {
			if fail.Load() {
				return nil, ca.ErrInvalidSigningMaterial
			}
			return a.SignX509SVID(p)
		})
	})
	c := f.client(t, nil, bootstrapToken)
	_, err := createCert(t, c, freshCSR(t))
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	fail.Store(false)
	_, err = createCert(t, c, freshCSR(t))
	require.NoError(t, err)
}

// gateSigner holds every signing until n have arrived, so n requests with
// one token have all authenticated before any of them spends it.
type gateSigner struct {
	next    certservice.Signer
	n       int32
	arrived atomic.Int32
	open    chan struct{}
}

func (g *gateSigner) SignX509SVID(p ca.X509SVIDParams) (*ca.Issued, error) {
	if g.arrived.Add(1) == g.n {
		close(g.open)
	}
	<-g.open
	return g.next.SignX509SVID(p)
}

// TestCreateCertificateSingleUseTokenRace: concurrent requests with one
// token, all signed: exactly one gets its certificate, the others are
// refused Unauthenticated and their certificates withheld.
func TestCreateCertificateSingleUseTokenRace(t *testing.T) {
	const n = 8
	f := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		singleUseAuth(t, authn.NewMemoryLedger())(cfg, a)
		cfg.Signer = &gateSigner{next: a, n: n, open: make(chan struct{})}
		cfg.Concurrency = n // all n in the signer at once
	})
	c := f.client(t, nil, bootstrapToken)
	codesSeen := make([]codes.Code, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, err := createCert(t, c, freshCSR(t, bootID.String()))
			codesSeen[i] = status.Code(err)
		})
	}
	wg.Wait()
	count := map[codes.Code]int{}
	for _, c := range codesSeen {
		count[c]++
	}
	assert.Equal(t, map[codes.Code]int{codes.OK: 1, codes.Unauthenticated: n - 1}, count)
	assert.Equal(t, int64(n), f.signer.calls.Load(), "every request was signed; only one certificate left the server")
	assert.Contains(t, f.logs.String(), "withheld")
}

// flakyLedger fails to record consumptions while down is set.
type flakyLedger struct {
	*authn.MemoryLedger
	down atomic.Bool
}

func (l *flakyLedger) Consume(ctx context.Context, c authn.Consumption) error {
	if l.down.Load() {
		return errors.New("etcdserver: request timed out")
	}
	return l.MemoryLedger.Consume(ctx, c)
}

// TestCreateCertificateLedgerDown: a consumption that cannot be recorded
// withholds the certificate with Unavailable and leaves the token usable.
func TestCreateCertificateLedgerDown(t *testing.T) {
	ledger := &flakyLedger{MemoryLedger: authn.NewMemoryLedger()}
	ledger.down.Store(true)
	f := newFixture(t, singleUseAuth(t, ledger))
	c := f.client(t, nil, bootstrapToken)
	_, err := createCert(t, c, freshCSR(t))
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Contains(t, f.logs.String(), `"reason":"token_ledger_unavailable"`)
	ledger.down.Store(false)
	_, err = createCert(t, c, freshCSR(t))
	require.NoError(t, err)
	_, err = createCert(t, c, freshCSR(t))
	require.Equal(t, codes.Unauthenticated, status.Code(err))
}

// A caller proven by a single-use token is not reported to
// Config.Authorized before it waits: a request refused after that (a bad
// CSR) leaves the token unspent, and one token must not confirm
// connection after connection that way. A reusable token's caller is.
func TestSingleUseTokenConfirmsNothingBeforeSuccess(t *testing.T) {
	var authorized atomic.Int32
	f := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		singleUseAuth(t, authn.NewMemoryLedger())(cfg, a)
		cfg.Authorized = func(context.Context) { authorized.Add(1) }
	})
	single := f.client(t, nil, bootstrapToken)
	for range 3 {
		_, err := createCert(t, single, "not a CSR")
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	}
	assert.Zero(t, authorized.Load(), "refused requests of a single-use token confirmed nothing")
	_, err := createCert(t, single, freshCSR(t, bootID.String()))
	require.NoError(t, err)
	assert.Zero(t, authorized.Load(), "a single-use token's success confirms its connection as any call's does, not through Authorized")

	_, err = createCert(t, f.client(t, nil, reusableToken), "not a CSR")
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	assert.Equal(t, int32(1), authorized.Load(), "a reusable token's request is heard of before it waits")
}
