package sds

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"math/big"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestNewMinter(t *testing.T) {
	s := SignerFunc(func(crypto.PublicKey, spiffeid.ID, time.Duration) ([]*x509.Certificate, error) {
		return nil, errTest
	})
	tests := []struct {
		name    string
		cfg     MinterConfig
		wantErr string
	}{
		{"ok", MinterConfig{Signer: s, TTL: time.Hour}, ""},
		{"no signer", MinterConfig{TTL: time.Hour}, "no signer"},
		{"no TTL", MinterConfig{Signer: s}, "TTL 0s must be positive"},
		{"negative TTL", MinterConfig{Signer: s, TTL: -time.Second}, "must be positive"},
		{"ratio above 1", MinterConfig{Signer: s, TTL: time.Hour, GraceRatio: 1.5}, "grace ratio 1.5"},
		{"negative ratio", MinterConfig{Signer: s, TTL: time.Hour, GraceRatio: -0.1}, "grace ratio"},
		{"negative entries", MinterConfig{Signer: s, TTL: time.Hour, MaxEntries: -1}, "max entries"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewMinter(tt.cfg)
			if tt.wantErr == "" {
				assert.NoError(t, err)
			} else {
				assert.ErrorContains(t, err, tt.wantErr)
			}
		})
	}
}

func TestRefreshAt(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name  string
		life  time.Duration
		ratio float64
		want  time.Time
	}{
		{"half", time.Hour, 0.5, nb.Add(30 * time.Minute)},
		{"whole", time.Hour, 1, nb.Add(time.Hour)},
		{"tenth of a day", 24 * time.Hour, 0.1, nb.Add(144 * time.Minute)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			leaf := &x509.Certificate{NotBefore: nb, NotAfter: nb.Add(tt.life)}
			assert.Equal(t, tt.want, refreshAt(leaf, tt.ratio))
		})
	}
}

func TestMinter(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	ca := newTestCA(t, localTD, clk)
	m, err := NewMinter(MinterConfig{Signer: ca, TTL: time.Hour, Clock: clk, MaxEntries: 2})
	require.NoError(t, err)

	a1, err := m.Credential(ctx, idA)
	require.NoError(t, err)
	require.NoError(t, checkCredential(a1.Chain, a1.Key, idA))
	assert.Equal(t, clk.Now().Add(30*time.Minute), a1.RefreshAt)
	assert.Equal(t, time.Hour, a1.Chain[0].NotAfter.Sub(a1.Chain[0].NotBefore))
	require.NotNil(t, a1.Changed)

	t.Run("cached until RefreshAt", func(t *testing.T) {
		clk.Step(29 * time.Minute)
		got, err := m.Credential(ctx, idA)
		require.NoError(t, err)
		assert.Same(t, a1, got)
		assert.Equal(t, 1, ca.signCount())
	})
	t.Run("re-minted at RefreshAt", func(t *testing.T) {
		clk.Step(time.Minute)
		got, err := m.Credential(ctx, idA)
		require.NoError(t, err)
		assert.NotSame(t, a1, got)
		assert.NotEqual(t, a1.Key, got.Key, "a new key")
		assert.True(t, closed(a1.Changed), "the old credential's Changed is closed")
		assert.False(t, closed(got.Changed))
		a1 = got
	})
	t.Run("no workload ID", func(t *testing.T) {
		_, err := m.Credential(ctx, localTD.ID())
		assert.ErrorContains(t, err, "not a workload SPIFFE ID")
	})
	t.Run("evicts the oldest", func(t *testing.T) {
		before := ca.signCount()
		idC := spiffeid.RequireFromPath(localTD, "/c")
		for _, id := range []spiffeid.ID{idB, idC} {
			_, err := m.Credential(ctx, id)
			require.NoError(t, err)
		}
		got, err := m.Credential(ctx, idA)
		require.NoError(t, err)
		assert.NotSame(t, a1, got, "idA was forgotten")
		assert.Equal(t, before+3, ca.signCount())
		assert.LessOrEqual(t, len(m.entries), 2)
	})
}

func TestMinterSharesOneSigning(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, localTD, clk)
	release := make(chan struct{})
	entered := make(chan struct{}, 10)
	signer := SignerFunc(func(pub crypto.PublicKey, id spiffeid.ID, ttl time.Duration) ([]*x509.Certificate, error) {
		entered <- struct{}{}
		<-release
		return ca.Sign(pub, id, ttl)
	})
	m, err := NewMinter(MinterConfig{Signer: signer, TTL: time.Hour, Clock: clk})
	require.NoError(t, err)

	const n = 8
	got := make([]*Credential, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c, err := m.Credential(context.Background(), idA)
			assert.NoError(t, err)
			got[i] = c
		})
	}
	<-entered
	// A caller whose context ends stops waiting; the signing goes on.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = m.Credential(ctx, idA)
	assert.ErrorIs(t, err, context.Canceled)
	close(release)
	wg.Wait()
	assert.Len(t, entered, 0, "one signing for all callers")
	for _, c := range got {
		assert.Same(t, got[0], c)
	}
}

func TestMinterFailures(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, localTD, clk)
	other := newTestCA(t, localTD, clk)
	var mu sync.Mutex
	mode := "fail"
	signer := SignerFunc(func(pub crypto.PublicKey, id spiffeid.ID, ttl time.Duration) ([]*x509.Certificate, error) {
		mu.Lock()
		defer mu.Unlock()
		switch mode {
		case "fail":
			return nil, errTest
		case "wrong id":
			return ca.Sign(pub, idB, ttl)
		case "wrong key":
			// A certificate for the right ID, but another key.
			c, err := NewMinter(MinterConfig{Signer: other, TTL: ttl, Clock: clk})
			if err != nil {
				return nil, err
			}
			cred, err := c.Credential(context.Background(), id)
			if err != nil {
				return nil, err
			}
			return cred.Chain, nil
		}
		return ca.Sign(pub, id, ttl)
	})
	m, err := NewMinter(MinterConfig{Signer: signer, TTL: time.Hour, Clock: clk})
	require.NoError(t, err)
	for _, tt := range []struct{ mode, wantErr string }{
		{"fail", "test failure"},
		{"wrong id", "leaf is for spiffe://local.test/ns/b/sa/b"},
		{"wrong key", "private key does not match"},
	} {
		t.Run(tt.mode, func(t *testing.T) {
			mu.Lock()
			mode = tt.mode
			mu.Unlock()
			_, err := m.Credential(context.Background(), idA)
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
	mu.Lock()
	mode = "ok"
	mu.Unlock()
	cred, err := m.Credential(context.Background(), idA)
	require.NoError(t, err, "failures are not cached")
	assert.NoError(t, checkCredential(cred.Chain, cred.Key, idA))
}

// dueSigner issues certificates already past their refresh point, as a CA
// whose signing chain is about to expire does: backdated by an hour, valid
// for one more second.
func dueSigner(t *testing.T, ca *testCA) (Signer, func() int) {
	t.Helper()
	var mu sync.Mutex
	signs := 0
	return SignerFunc(func(pub crypto.PublicKey, id spiffeid.ID, _ time.Duration) ([]*x509.Certificate, error) {
			mu.Lock()
			signs++
			serial := int64(signs)
			mu.Unlock()
			now := ca.clock.Now()
			tmpl := &x509.Certificate{
				SerialNumber: big.NewInt(serial),
				NotBefore:    now.Add(-time.Hour),
				NotAfter:     now.Add(time.Second),
				URIs:         []*url.URL{id.URL()},
				KeyUsage:     x509.KeyUsageDigitalSignature,
			}
			der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
			if err != nil {
				return nil, err
			}
			leaf, err := x509.ParseCertificate(der)
			if err != nil {
				return nil, err
			}
			return []*x509.Certificate{leaf}, nil
		}), func() int {
			mu.Lock()
			defer mu.Unlock()
			return signs
		}
}

func TestMinterKeepsDueCredentialsAWhile(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	signer, signs := dueSigner(t, newTestCA(t, localTD, clk))
	m, err := NewMinter(MinterConfig{Signer: signer, TTL: time.Hour, Clock: clk})
	require.NoError(t, err)

	first, err := m.Credential(ctx, idA)
	require.NoError(t, err)
	assert.Equal(t, clk.Now().Add(minRefreshDelay), first.RefreshAt, "not before minRefreshDelay")
	tests := []struct {
		name      string
		step      time.Duration
		wantSame  bool
		wantSigns int
	}{
		{"asked again at once", 0, true, 1},
		{"asked again just before", minRefreshDelay - time.Millisecond, true, 1},
		{"asked again at the delay", time.Millisecond, false, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk.Step(tt.step)
			got, err := m.Credential(ctx, idA)
			require.NoError(t, err)
			assert.Equal(t, tt.wantSame, got == first)
			assert.Equal(t, tt.wantSigns, signs())
		})
	}
}

// TestMinterExpire: a credential whose leaf an operator's taint makes
// stale is minted anew at the next request, and its holders are woken;
// the others stay cached.
func TestMinterExpire(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	ca := newTestCA(t, localTD, clk)
	m, err := NewMinter(MinterConfig{Signer: ca, TTL: time.Hour, Clock: clk})
	require.NoError(t, err)
	a, err := m.Credential(ctx, idA)
	require.NoError(t, err)
	b, err := m.Credential(ctx, idB)
	require.NoError(t, err)

	stale := func(leaf *x509.Certificate) bool { return leaf.Equal(a.Chain[0]) }
	assert.Equal(t, 1, m.Expire(stale))
	assert.True(t, closed(a.Changed), "a's holders are woken")
	assert.False(t, closed(b.Changed))
	assert.Equal(t, 0, m.Expire(stale), "expired once; not woken again before it is re-minted")

	got, err := m.Credential(ctx, idA)
	require.NoError(t, err)
	assert.NotSame(t, a, got, "minted anew, though not due")
	assert.False(t, closed(got.Changed))
	again, err := m.Credential(ctx, idA)
	require.NoError(t, err)
	assert.Same(t, got, again, "and cached again")
	gotB, err := m.Credential(ctx, idB)
	require.NoError(t, err)
	assert.Same(t, b, gotB)
}

// TestMinterExpireWhileSigning: a credential being signed when Expire
// runs is checked when the signing ends: signed by the tainted authority,
// its holders are woken at once and the next request mints anew.
func TestMinterExpireWhileSigning(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	ca := newTestCA(t, localTD, clk)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var blocking atomic.Bool
	blocking.Store(true)
	signer := SignerFunc(func(pub crypto.PublicKey, id spiffeid.ID, ttl time.Duration) ([]*x509.Certificate, error) {
		if blocking.Load() {
			entered <- struct{}{}
			<-release
		}
		return ca.Sign(pub, id, ttl)
	})
	m, err := NewMinter(MinterConfig{Signer: signer, TTL: time.Hour, Clock: clk})
	require.NoError(t, err)
	got := make(chan *Credential, 1)
	go func() {
		c, err := m.Credential(ctx, idA)
		assert.NoError(t, err)
		got <- c
	}()
	<-entered
	assert.Equal(t, 0, m.Expire(func(*x509.Certificate) bool { return true }), "nothing held yet")
	blocking.Store(false)
	close(release)
	first := <-got
	assert.True(t, closed(first.Changed), "signed while Expire ran, by what it expires: its holders ask again")
	again, err := m.Credential(ctx, idA)
	require.NoError(t, err)
	assert.NotSame(t, first, again, "minted anew")
	assert.False(t, closed(again.Changed))
}

// TestMinterExpireKeepsTheOldWhileSigningFails: a credential expired by
// a taint stays handed out while a new one cannot be signed; the next
// request tries again.
func TestMinterExpireKeepsTheOldWhileSigningFails(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	ca := newTestCA(t, localTD, clk)
	var failing atomic.Bool
	signer := SignerFunc(func(pub crypto.PublicKey, id spiffeid.ID, ttl time.Duration) ([]*x509.Certificate, error) {
		if failing.Load() {
			return nil, errors.New("CA unavailable")
		}
		return ca.Sign(pub, id, ttl)
	})
	m, err := NewMinter(MinterConfig{Signer: signer, TTL: time.Hour, Clock: clk})
	require.NoError(t, err)
	old, err := m.Credential(ctx, idA)
	require.NoError(t, err)
	failing.Store(true)
	require.Equal(t, 1, m.Expire(func(*x509.Certificate) bool { return true }))
	got, err := m.Credential(ctx, idA)
	require.NoError(t, err, "the old credential, still valid, instead of an error")
	assert.Same(t, old, got)
	failing.Store(false)
	fresh, err := m.Credential(ctx, idA)
	require.NoError(t, err)
	assert.NotSame(t, old, fresh, "the next request mints anew once signing works")
}
