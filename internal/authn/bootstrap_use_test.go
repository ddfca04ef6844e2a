package authn

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

// useFixture is a token file with a single-use, an expiring and a
// reusable token, loaded with a ledger and a fake clock.
type useFixture struct {
	b      *BootstrapTokens
	clk    *clocktesting.FakeClock
	reg    *prometheus.Registry
	ledger TokenLedger
	path   string
}

func newUseFixture(t *testing.T, ledger TokenLedger) *useFixture {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens.csv")
	writeTokens(t, path, "# single-use, expiring single-use, reusable\n"+
		tokLaptop+",spiffe://example.org/laptop/alice\n"+
		tokVM+",spiffe://example.org/vm/build,expires="+epoch.Add(time.Hour).Format(time.RFC3339)+"\n"+
		tokVM2+",spiffe://example.org/vm/build,reusable\n", 0o600)
	return loadUseFixture(t, path, ledger)
}

func loadUseFixture(t *testing.T, path string, ledger TokenLedger) *useFixture {
	t.Helper()
	f := &useFixture{clk: clocktesting.NewFakeClock(epoch), reg: prometheus.NewRegistry(), ledger: ledger, path: path}
	var err error
	f.b, err = NewBootstrapTokens(BootstrapTokensConfig{Path: path, TrustDomain: localTD, Clock: f.clk, Registerer: f.reg, Ledger: ledger})
	require.NoError(t, err)
	return f
}

func (f *useFixture) refusals(reason string) float64 {
	return testutil.ToFloat64(f.b.m.refusals.WithLabelValues(reason))
}

func (f *useFixture) consumptions(result string) float64 {
	return testutil.ToFloat64(f.b.m.consumptions.WithLabelValues(result))
}

// TestBootstrapTokenSingleUse: a token buys one certificate (Spend), then
// is refused as consumed and counted; a request that authenticated but
// never spent (a certificate refused after authentication) leaves it
// usable.
func TestBootstrapTokenSingleUse(t *testing.T) {
	f := newUseFixture(t, NewMemoryLedger())
	ctx := context.Background()

	id, err := f.b.Authenticate(ctx, Request{BearerToken: tokLaptop})
	require.NoError(t, err)
	require.NotNil(t, id.Spend, "a single-use token must be spent by whoever issues")
	// The issuance failed (a bad CSR): Spend never called, token intact.
	id, err = f.b.Authenticate(ctx, Request{BearerToken: tokLaptop})
	require.NoError(t, err, "a request that bought nothing does not consume the token")
	assert.Equal(t, laptopID, id.ID)

	require.NoError(t, id.Spend(ctx))
	assert.Equal(t, 1.0, f.consumptions("consumed"))

	_, err = f.b.Authenticate(ctx, Request{BearerToken: tokLaptop})
	require.ErrorIs(t, err, ErrTokenConsumed)
	require.ErrorIs(t, err, ErrInvalidCredentials)
	assert.Contains(t, err.Error(), "line 2 of "+f.path)
	assert.Contains(t, err.Error(), "consumed at "+epoch.Format(time.RFC3339))
	assert.Contains(t, err.Error(), BootstrapGrantRef(sha256Of(tokLaptop)))
	assert.NotContains(t, err.Error(), tokLaptop)
	assert.Equal(t, 1.0, f.refusals("consumed"))

	// Spending the same identity again (a second request that
	// authenticated before the first spent) loses.
	err = id.Spend(ctx)
	require.ErrorIs(t, err, ErrTokenConsumed)
	assert.Equal(t, 1.0, f.consumptions("already_consumed"))
	assert.Equal(t, 2.0, f.refusals("consumed"))

	// Renewals by the certificate it bought still stand: the grant is
	// the token being listed, not unconsumed.
	require.NoError(t, f.b.CheckGrant(ctx, laptopID, *id.Grant))
}

// TestBootstrapTokenExpiry: a token is refused from its expires= instant
// on, counted, whether or not it was consumed; its grant still stands.
func TestBootstrapTokenExpiry(t *testing.T) {
	f := newUseFixture(t, NewMemoryLedger())
	ctx := context.Background()

	f.clk.Step(time.Hour - time.Second)
	id, err := f.b.Authenticate(ctx, Request{BearerToken: tokVM})
	require.NoError(t, err, "one second before expiry")
	f.clk.Step(time.Second)
	_, err = f.b.Authenticate(ctx, Request{BearerToken: tokVM})
	require.ErrorIs(t, err, ErrTokenExpired)
	require.ErrorIs(t, err, ErrInvalidCredentials)
	assert.Contains(t, err.Error(), "expired at "+epoch.Add(time.Hour).Format(time.RFC3339))
	assert.NotContains(t, err.Error(), tokVM)
	assert.Equal(t, 1.0, f.refusals("expired"))
	assert.Zero(t, f.refusals("consumed"))
	require.NoError(t, f.b.CheckGrant(ctx, vmID, *id.Grant), "expiry bounds buying a first certificate, not renewing it")
}

// TestBootstrapTokenReusable: a reusable line works repeatedly and is
// never recorded.
func TestBootstrapTokenReusable(t *testing.T) {
	ledger := NewMemoryLedger()
	f := newUseFixture(t, ledger)
	for range 3 {
		id, err := f.b.Authenticate(context.Background(), Request{BearerToken: tokVM2})
		require.NoError(t, err)
		assert.Nil(t, id.Spend, "a reusable token is not spent")
	}
	assert.Empty(t, ledger.consumed)
	assert.Zero(t, f.consumptions("consumed"))

	// The unknown-token refusal is counted too.
	_, err := f.b.Authenticate(context.Background(), Request{BearerToken: "nobody-0123456789abcdef"})
	require.ErrorIs(t, err, ErrInvalidCredentials)
	assert.Equal(t, 1.0, f.refusals("unknown"))
}

// TestBootstrapTokenConcurrentUse: requests racing with one token all
// authenticate (none has spent it yet), then all spend: exactly one wins.
func TestBootstrapTokenConcurrentUse(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) TokenLedger{
		"memory": func(*testing.T) TokenLedger { return NewMemoryLedger() },
		"file": func(t *testing.T) TokenLedger {
			l, err := OpenFileLedger(filepath.Join(t.TempDir(), LedgerFileName))
			require.NoError(t, err)
			return l
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newUseFixture(t, open(t))
			const n = 16
			ids := make([]Identity, n)
			for i := range ids {
				var err error
				ids[i], err = f.b.Authenticate(context.Background(), Request{BearerToken: tokLaptop})
				require.NoError(t, err)
			}
			exactlyOneConsumes(t, n, func(i int) error { return ids[i].Spend(context.Background()) }, "request")
			assert.Equal(t, 1.0, f.consumptions("consumed"))
			assert.Equal(t, float64(n-1), f.consumptions("already_consumed"))
		})
	}
}

// TestBootstrapTokenRestart: consumption is in the data directory's
// ledger, so a new server (a new BootstrapTokens on the reopened ledger)
// still refuses the token.
func TestBootstrapTokenRestart(t *testing.T) {
	ledgerPath := filepath.Join(t.TempDir(), LedgerFileName)
	l1, err := OpenFileLedger(ledgerPath)
	require.NoError(t, err)
	f := newUseFixture(t, l1)
	id, err := f.b.Authenticate(context.Background(), Request{BearerToken: tokLaptop})
	require.NoError(t, err)
	require.NoError(t, id.Spend(context.Background()))

	info, err := os.Stat(ledgerPath)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	data, err := os.ReadFile(ledgerPath)
	require.NoError(t, err)
	assert.NotContains(t, string(data), tokLaptop, "the ledger never holds the token")
	assert.Contains(t, string(data), BootstrapGrantRef(sha256Of(tokLaptop)))

	l2, err := OpenFileLedger(ledgerPath)
	require.NoError(t, err)
	restarted := loadUseFixture(t, f.path, l2)
	_, err = restarted.b.Authenticate(context.Background(), Request{BearerToken: tokLaptop})
	require.ErrorIs(t, err, ErrTokenConsumed)
	assert.Equal(t, 1.0, restarted.refusals("consumed"))
	_, err = restarted.b.Authenticate(context.Background(), Request{BearerToken: tokVM})
	require.NoError(t, err, "other tokens are untouched")
}

// failingLedger answers but cannot record.
type failingLedger struct{ MemoryLedger }

func (*failingLedger) Consume(context.Context, Consumption) error {
	return errors.New("disk full")
}

// TestBootstrapTokenLedgerFailure: a consumption that cannot be recorded
// is ErrUnavailable (the caller retries), counted, and leaves the token
// usable.
func TestBootstrapTokenLedgerFailure(t *testing.T) {
	f := newUseFixture(t, &failingLedger{MemoryLedger: *NewMemoryLedger()})
	id, err := f.b.Authenticate(context.Background(), Request{BearerToken: tokLaptop})
	require.NoError(t, err)
	err = id.Spend(context.Background())
	require.ErrorIs(t, err, ErrUnavailable)
	assert.NotErrorIs(t, err, ErrInvalidCredentials)
	assert.Contains(t, err.Error(), "disk full")
	assert.Equal(t, 1.0, f.consumptions("error"))
	_, err = f.b.Authenticate(context.Background(), Request{BearerToken: tokLaptop})
	require.NoError(t, err, "not consumed")
}

// TestBootstrapTokenMarkerEdited: marking a consumed token's line reusable
// is the operator's explicit way to let it buy certificates again; taking
// the marker away makes it single-use from then on.
func TestBootstrapTokenMarkerEdited(t *testing.T) {
	f := newUseFixture(t, NewMemoryLedger())
	ctx := context.Background()
	id, err := f.b.Authenticate(ctx, Request{BearerToken: tokLaptop})
	require.NoError(t, err)
	require.NoError(t, id.Spend(ctx))

	writeTokens(t, f.path, tokLaptop+",spiffe://example.org/laptop/alice,reusable\n"+tokVM2+",spiffe://example.org/vm/build\n", 0o600)
	require.NoError(t, f.b.Reload())
	id, err = f.b.Authenticate(ctx, Request{BearerToken: tokLaptop})
	require.NoError(t, err)
	assert.Nil(t, id.Spend)
	id, err = f.b.Authenticate(ctx, Request{BearerToken: tokVM2})
	require.NoError(t, err)
	assert.NotNil(t, id.Spend, "no longer reusable")
}

// TestReusableOnly: a service that cannot spend refuses single-use
// identities and passes every other one through.
func TestReusableOnly(t *testing.T) {
	f := newUseFixture(t, NewMemoryLedger())
	auth := ReusableOnly(f.b)
	_, err := auth.Authenticate(context.Background(), Request{BearerToken: tokLaptop})
	require.ErrorIs(t, err, ErrSingleUse)
	require.ErrorIs(t, err, ErrInvalidCredentials)
	assert.Contains(t, err.Error(), "mark its line reusable")
	assert.NotContains(t, err.Error(), tokLaptop)
	id, err := auth.Authenticate(context.Background(), Request{BearerToken: tokVM2})
	require.NoError(t, err)
	assert.Equal(t, vmID, id.ID)
	_, err = auth.Authenticate(context.Background(), Request{})
	require.ErrorIs(t, err, ErrNoCredentials)
	_, consumed, err := f.ledger.Consumed(context.Background(), BootstrapGrantRef(sha256Of(tokLaptop)))
	require.NoError(t, err)
	assert.False(t, consumed, "refusing is not spending")
}
