package agent

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net/url"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
	"github.com/trustbridge/trustbridge/sds"
)

// issueFor mints an X509-SVID for id and pub, valid from nb for ttl.
func issueFor(t testing.TB, ca *testca.CA, id spiffeid.ID, pub crypto.PublicKey, nb time.Time, ttl time.Duration) *x509.Certificate {
	t.Helper()
	return testca.Sign(t, &x509.Certificate{
		SerialNumber:          serial(t),
		NotBefore:             nb,
		NotAfter:              nb.Add(ttl),
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:                  []*url.URL{id.URL()},
	}, ca.Cert, pub, ca.Key)
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64))
	require.NoError(t, err)
	return n
}

// fakeFetcher issues certificates of ttl from now for the key asked for,
// counting requests per identity; fail, when set, fails them, and gate,
// when set, holds each until it is closed.
type fakeFetcher struct {
	t   testing.TB
	ca  *testca.CA
	ttl time.Duration

	mu    sync.Mutex
	calls map[spiffeid.ID]int
	fail  error
	gate  chan struct{}
}

func newFakeFetcher(t testing.TB, ttl time.Duration) *fakeFetcher {
	return &fakeFetcher{t: t, ca: testca.New(t, tdA.Name(), testca.Options{NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(100 * 24 * time.Hour)}),
		ttl: ttl, calls: map[spiffeid.ID]int{}}
}

func (f *fakeFetcher) FetchX509SVID(ctx context.Context, id spiffeid.ID, key crypto.Signer) ([]*x509.Certificate, error) {
	f.mu.Lock()
	f.calls[id]++
	fail, gate := f.fail, f.gate
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if fail != nil {
		return nil, fail
	}
	return []*x509.Certificate{issueFor(f.t, f.ca, id, key.Public(), time.Now(), f.ttl)}, nil
}

func (f *fakeFetcher) setFail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

func (f *fakeFetcher) callsFor(id spiffeid.ID) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[id]
}

func newTestCache(t testing.TB, cfg IdentityCacheConfig) *IdentityCache {
	t.Helper()
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	c, err := NewIdentityCache(cfg)
	require.NoError(t, err)
	return c
}

// fixedRand is a Rand always returning v.
func fixedRand(v float64) func() float64 { return func() float64 { return v } }

// acquire acquires id, failing the test on error; the handle is released
// at the end of the test.
func acquire(t *testing.T, c *IdentityCache, id spiffeid.ID) *IdentityHandle {
	t.Helper()
	h, err := c.Acquire(t.Context(), id)
	require.NoError(t, err)
	t.Cleanup(h.Release)
	return h
}

func credOf(t *testing.T, h *IdentityHandle) *sds.Credential {
	t.Helper()
	cred, err := h.Credential(t.Context(), h.ID())
	require.NoError(t, err)
	return cred
}

// zeroed reports whether zeroKey overwrote k's scalar.
func zeroed(k crypto.Signer) bool {
	//lint:ignore SA1019 the test reads what zeroKey wrote
	d := k.(*ecdsa.PrivateKey).D
	return d.Sign() == 0
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestNewIdentityCacheConfig(t *testing.T) {
	f := newFakeFetcher(t, time.Hour)
	c := newTestCache(t, IdentityCacheConfig{Fetcher: f})
	assert.Equal(t, 1000, c.max, "SPIRE's bound by default")
	assert.Equal(t, DefaultMaxIdentities, c.max)
	assert.Equal(t, time.Minute, c.linger)
	assert.Equal(t, DefaultMaxConcurrentFetches, cap(c.sem))
	assert.Equal(t, 0.5, c.grace)

	for name, tt := range map[string]struct {
		cfg IdentityCacheConfig
		msg string
	}{
		"no fetcher":         {IdentityCacheConfig{}, "no fetcher"},
		"negative bound":     {IdentityCacheConfig{Fetcher: f, MaxIdentities: -1}, "must not be negative"},
		"negative linger":    {IdentityCacheConfig{Fetcher: f, Linger: -time.Second}, "must not be negative"},
		"negative fetches":   {IdentityCacheConfig{Fetcher: f, MaxConcurrentFetches: -1}, "must not be negative"},
		"grace out of range": {IdentityCacheConfig{Fetcher: f, GraceRatio: 0.95}, "grace ratio"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewIdentityCache(tt.cfg)
			assert.ErrorContains(t, err, tt.msg)
		})
	}
}

func TestRenewAt(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	na := nb.Add(10 * time.Hour)
	for _, tt := range []struct {
		grace, jitter float64
		want          time.Duration
	}{
		{0.5, 0.5, 5 * time.Hour},                     // no jitter: half life
		{0.5, 0, 4*time.Hour + 30*time.Minute},        // earliest: 5% before
		{0.5, 0.999999, 5*time.Hour + 30*time.Minute}, // latest: 5% after
		{0.8, 0.5, 8 * time.Hour},
	} {
		got := renewAt(nb, na, tt.grace, tt.jitter).Sub(nb)
		assert.InDelta(t, tt.want, got, float64(100*time.Millisecond), "grace %v jitter %v", tt.grace, tt.jitter)
	}
}

// A leaf whose grace point has passed when it arrives (backdated, or
// mostly spent) is renewed at the grace point of what is left, and never
// sooner than retry.Base from now.
func TestNextRenewal(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	c := newTestCache(t, IdentityCacheConfig{Fetcher: newFakeFetcher(t, time.Hour), Clock: clocktesting.NewFakeClock(now), Rand: fixedRand(0.5)})
	leaf := func(nb, na time.Time) *x509.Certificate { return &x509.Certificate{NotBefore: nb, NotAfter: na} }
	for name, tt := range map[string]struct {
		leaf *x509.Certificate
		want time.Time
	}{
		"fresh":      {leaf(now, now.Add(time.Hour)), now.Add(30 * time.Minute)},
		"backdated":  {leaf(now.Add(-50*time.Minute), now.Add(10*time.Minute)), now.Add(5 * time.Minute)},
		"nearly out": {leaf(now.Add(-time.Hour), now.Add(time.Second)), now.Add(identityRetryBase)},
	} {
		assert.Equal(t, tt.want, c.nextRenewal(tt.leaf), name)
	}
}

// N processes asking for one identity at once cause one request; each
// gets the same credential, for that identity only.
func TestIdentityCacheSharesFirstFetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeFetcher(t, time.Hour)
		f.gate = make(chan struct{})
		c := newTestCache(t, IdentityCacheConfig{Fetcher: f})
		startServing(t, c.Run)

		const n = 50
		handles := make([]*IdentityHandle, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				h, err := c.Acquire(context.Background(), webID)
				assert.NoError(t, err)
				handles[i] = h
			})
		}
		synctest.Wait() // every Acquire waits on the one fetch
		assert.Equal(t, 1, f.callsFor(webID))
		close(f.gate)
		wg.Wait()

		first := credOf(t, handles[0])
		for _, h := range handles {
			require.NotNil(t, h)
			assert.Same(t, first, credOf(t, h), "one certificate, shared")
			_, err := h.Credential(t.Context(), apiID)
			assert.ErrorContains(t, err, "holds "+webID.String()+", not "+apiID.String())
			h.Release()
		}
		assert.Equal(t, 1, f.callsFor(webID))
		assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.fetches.WithLabelValues("success")))
		assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.entries))

		_, err := handles[0].Credential(t.Context(), webID)
		assert.ErrorIs(t, err, ErrIdentityReleased)
	})
}

// A first fetch that fails fails every Acquire that waited for it, once,
// and leaves nothing cached.
func TestIdentityCacheFirstFetchFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeFetcher(t, time.Hour)
		f.gate = make(chan struct{})
		f.fail = status.Error(codes.PermissionDenied, "not on this node")
		c := newTestCache(t, IdentityCacheConfig{Fetcher: f})
		startServing(t, c.Run)

		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				_, err := c.Acquire(context.Background(), webID)
				assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
			})
		}
		synctest.Wait()
		close(f.gate)
		wg.Wait()
		assert.Equal(t, 1, f.callsFor(webID))
		assert.Equal(t, 0.0, testutil.ToFloat64(c.metrics.entries))
		assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.fetches.WithLabelValues("refused")))
	})
}

// At half life, give or take the jitter, a new certificate with a new key
// replaces the old one, and every holder's watcher hears of it.
func TestIdentityCacheRenewsAtHalfLife(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeFetcher(t, time.Hour)
		// Jitter 0.25: 0.5 - 0.1*0.25 of the lifetime.
		c := newTestCache(t, IdentityCacheConfig{Fetcher: f, Rand: fixedRand(0.25)})
		startServing(t, c.Run)
		start := time.Now()
		h1, h2 := acquire(t, c, webID), acquire(t, c, webID)
		old := credOf(t, h1)
		w1, w2 := h1.Changed(), h2.Changed()
		assert.Equal(t, old.Changed, w1)

		renewal := renewAt(start, start.Add(time.Hour), 0.5, 0.25)
		assert.Equal(t, 28*time.Minute+30*time.Second, renewal.Sub(start).Round(time.Second), "5%*(0.25-0.5) of the lifetime early")
		time.Sleep(time.Until(renewal) - time.Nanosecond)
		synctest.Wait()
		assert.False(t, closed(w1) || closed(w2), "not before the grace point")
		assert.Equal(t, 1, f.callsFor(webID))

		time.Sleep(time.Nanosecond)
		synctest.Wait()
		assert.True(t, closed(w1) && closed(w2), "every holder is told")
		assert.Equal(t, 2, f.callsFor(webID))
		fresh := credOf(t, h1)
		assert.Same(t, fresh, credOf(t, h2))
		assert.NotSame(t, old, fresh)
		assert.WithinDuration(t, renewal, fresh.Chain[0].NotBefore, time.Second)
		assert.False(t, old.Key.Public().(*ecdsa.PublicKey).Equal(fresh.Key.Public()), "a new key for every certificate")
		assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.renewals))
	})
}

// A renewal the server refuses (PermissionDenied: this node may no
// longer have the identity) stops serving it at once, unlike an outage;
// the next holder asks the server again.
func TestIdentityCacheRevokedAtRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeFetcher(t, time.Hour)
		c := newTestCache(t, IdentityCacheConfig{Fetcher: f, Rand: fixedRand(0.5)})
		startServing(t, c.Run)
		h := acquire(t, c, webID)
		changed := h.Changed()
		key := credOf(t, h).Key
		f.setFail(fmt.Errorf("the certificate service: %w", status.Error(codes.PermissionDenied, "no pod of shop/web on this node")))
		time.Sleep(31 * time.Minute)
		synctest.Wait()
		assert.True(t, closed(changed), "holders are told")
		_, err := h.Credential(t.Context(), webID)
		require.ErrorIs(t, err, ErrIdentityRevoked)
		assert.ErrorContains(t, err, "no pod of shop/web on this node")
		assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.revocations))
		assert.Equal(t, 0.0, testutil.ToFloat64(c.metrics.entries))
		assert.False(t, zeroed(key), "a holder may be sending the key: kept while held")
		h.Release()
		assert.True(t, zeroed(key), "zeroed when the last holder lets go")

		_, err = c.Acquire(t.Context(), webID)
		require.Error(t, err, "asked again, and refused again")
		assert.Equal(t, 3, f.callsFor(webID))
	})
}

// A first fetch the server refused is answered from memory for a few
// seconds: a process reconnecting in a loop costs the server one request
// per refusalMemory, not one per connection. An outage is not
// remembered.
func TestIdentityCacheRemembersRefusals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeFetcher(t, time.Hour)
		c := newTestCache(t, IdentityCacheConfig{Fetcher: f, Rand: fixedRand(0.5)})
		startServing(t, c.Run)
		f.setFail(status.Error(codes.PermissionDenied, "no pod of shop/web on this node"))
		for range 3 {
			_, err := c.Acquire(t.Context(), webID)
			require.Error(t, err)
			assert.Equal(t, codes.PermissionDenied, status.Code(err), "the server's refusal, remembered")
		}
		assert.Equal(t, 1, f.callsFor(webID))
		time.Sleep(refusalMemory)
		f.setFail(nil)
		_, err := c.Acquire(t.Context(), webID)
		require.NoError(t, err, "asked again after refusalMemory")
		assert.Equal(t, 2, f.callsFor(webID))

		f.setFail(status.Error(codes.Unavailable, "down"))
		for range 2 {
			_, err := c.Acquire(t.Context(), apiID)
			require.Error(t, err)
		}
		assert.Equal(t, 2, f.callsFor(apiID), "an outage is asked again at once")
	})
}

// While the server is down the last good certificate is served, with the
// failure counted and logged, and renewal is retried with backoff until
// the server is back.
func TestIdentityCacheServesLastGoodWhileDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeFetcher(t, time.Hour)
		var logs testlog.Buffer
		c := newTestCache(t, IdentityCacheConfig{Fetcher: f, Rand: fixedRand(0.5), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		startServing(t, c.Run)
		h := acquire(t, c, webID)
		good := credOf(t, h)

		f.setFail(status.Error(codes.Unavailable, "connection refused"))
		time.Sleep(30 * time.Minute)
		synctest.Wait()
		assert.Same(t, good, credOf(t, h), "the last good certificate")
		assert.False(t, closed(h.Changed()))
		assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.stale))
		assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.fetches.WithLabelValues("unavailable")))
		assert.Contains(t, logs.String(), "renewing an identity's certificate failed")
		assert.Contains(t, logs.String(), "connection refused")

		time.Sleep(10 * time.Minute) // retried, with backoff
		synctest.Wait()
		retries := testutil.ToFloat64(c.metrics.fetches.WithLabelValues("unavailable"))
		assert.Greater(t, retries, 3.0)
		assert.Less(t, retries, 30.0, "backing off, not hammering")
		assert.Same(t, good, credOf(t, h))

		f.setFail(nil)
		time.Sleep(retryCeiling)
		synctest.Wait()
		assert.True(t, closed(good.Changed))
		assert.NotSame(t, good, credOf(t, h), "renewed once the server is back")
		assert.Equal(t, 0.0, testutil.ToFloat64(c.metrics.stale))
		assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.renewals))
	})
}

// retryCeiling is more than any delay between retries.
const retryCeiling = identityRetryMax + time.Second

// A certificate that expires while the server is down is not served: its
// holders are told, and get an error until a renewal succeeds.
func TestIdentityCacheNeverServesExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeFetcher(t, time.Hour)
		c := newTestCache(t, IdentityCacheConfig{Fetcher: f, Rand: fixedRand(0.5)})
		startServing(t, c.Run)
		h := acquire(t, c, webID)
		good := credOf(t, h)
		notAfter := good.Chain[0].NotAfter

		f.setFail(status.Error(codes.Unavailable, "connection refused"))
		time.Sleep(time.Until(notAfter) - time.Nanosecond)
		synctest.Wait()
		assert.Same(t, good, credOf(t, h), "served until the last moment")

		time.Sleep(time.Nanosecond)
		synctest.Wait()
		assert.True(t, closed(good.Changed), "holders are told")
		_, err := h.Credential(t.Context(), webID)
		assert.ErrorIs(t, err, ErrCredentialExpired)
		assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.expirations))
		assert.Equal(t, 0.0, testutil.ToFloat64(c.metrics.stale), "not stale: nothing served")

		f.setFail(nil)
		time.Sleep(retryCeiling)
		synctest.Wait()
		fresh := credOf(t, h)
		assert.True(t, time.Now().Before(fresh.Chain[0].NotAfter))
	})
}

// The handle itself never returns an expired certificate, even before
// the cache has noticed the expiry.
func TestIdentityHandleChecksExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeFetcher(t, time.Hour)
		c := newTestCache(t, IdentityCacheConfig{Fetcher: f})
		startServing(t, c.Run)
		h := acquire(t, c, webID)
		// As if the maintain goroutine were late: the state holds a
		// certificate past its NotAfter.
		key := newKey(t)
		h.e.publish(&sds.Credential{Chain: []*x509.Certificate{issueFor(t, f.ca, webID, key.Public(), time.Now().Add(-time.Hour), time.Hour)}, Key: key}, nil)
		_, err := h.Credential(t.Context(), webID)
		assert.ErrorIs(t, err, ErrCredentialExpired)
	})
}

// An identity its last holder released stays for the linger (a holder
// coming back gets it without a new request), then is dropped: its key
// zeroed, never renewed again.
func TestIdentityCacheDropsAfterLinger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeFetcher(t, time.Hour)
		c := newTestCache(t, IdentityCacheConfig{Fetcher: f, Rand: fixedRand(0.5)})
		startServing(t, c.Run)
		h, err := c.Acquire(t.Context(), webID)
		require.NoError(t, err)
		cred := credOf(t, h)
		h.Release()
		h.Release() // once only

		time.Sleep(DefaultIdentityLinger / 2)
		h, err = c.Acquire(t.Context(), webID)
		require.NoError(t, err)
		assert.Same(t, cred, credOf(t, h), "back within the linger: the same certificate")
		assert.Equal(t, 1, f.callsFor(webID))
		h.Release()

		time.Sleep(DefaultIdentityLinger - time.Nanosecond)
		synctest.Wait()
		assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.entries))
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		assert.Equal(t, 0.0, testutil.ToFloat64(c.metrics.entries), "dropped at the end of the linger")
		assert.True(t, zeroed(cred.Key), "its key zeroed")

		time.Sleep(3 * time.Hour)
		synctest.Wait()
		assert.Equal(t, 1, f.callsFor(webID), "no renewal after the drop")
	})
}

// A Companion runs beside each identity from its first certificate until
// it is dropped, once per stay in the cache; an identity whose first
// fetch fails gets none; Run waits for them all.
func TestIdentityCacheCompanion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeFetcher(t, time.Hour)
		var (
			mu      sync.Mutex
			running = map[spiffeid.ID]int{}
			started = map[spiffeid.ID]int{}
		)
		companion := func(ctx context.Context, id spiffeid.ID) {
			mu.Lock()
			running[id]++
			started[id]++
			mu.Unlock()
			<-ctx.Done()
			mu.Lock()
			running[id]--
			mu.Unlock()
		}
		count := func(m map[spiffeid.ID]int, id spiffeid.ID) int {
			mu.Lock()
			defer mu.Unlock()
			return m[id]
		}
		c := newTestCache(t, IdentityCacheConfig{Fetcher: f, Rand: fixedRand(0.5), Companion: companion})
		ctx, stop := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()

		h1, err := c.Acquire(t.Context(), webID)
		require.NoError(t, err)
		h2, err := c.Acquire(t.Context(), webID)
		require.NoError(t, err)
		synctest.Wait()
		assert.Equal(t, 1, count(running, webID), "one companion per identity, however many hold it")
		h1.Release()
		h2.Release()
		time.Sleep(DefaultIdentityLinger)
		synctest.Wait()
		assert.Equal(t, 0, count(running, webID), "ended when the identity was dropped")

		f.setFail(errors.New("refused"))
		_, err = c.Acquire(t.Context(), apiID)
		require.Error(t, err)
		synctest.Wait()
		assert.Equal(t, 0, count(started, apiID), "none for an identity the server refused")

		f.setFail(nil)
		h, err := c.Acquire(t.Context(), webID)
		require.NoError(t, err)
		synctest.Wait()
		assert.Equal(t, 2, count(started, webID), "a new stay, a new companion")
		stop()
		require.NoError(t, <-done)
		assert.Equal(t, 0, count(running, webID), "Run returned after its companions")
		h.Release()
	})
}

// At its bound the cache refuses a new identity while every identity is
// held, and otherwise makes room by dropping the identity released
// longest ago; an identity a process holds is never dropped.
func TestIdentityCacheBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeFetcher(t, 24*time.Hour)
		c := newTestCache(t, IdentityCacheConfig{Fetcher: f, MaxIdentities: 2, Linger: time.Hour})
		startServing(t, c.Run)
		web, err := c.Acquire(t.Context(), webID)
		require.NoError(t, err)
		api, err := c.Acquire(t.Context(), apiID)
		require.NoError(t, err)

		_, err = c.Acquire(t.Context(), dbID)
		require.ErrorIs(t, err, ErrIdentityCacheFull)
		assert.ErrorContains(t, err, "(2 identities)")
		assert.Equal(t, 0, f.callsFor(dbID), "refused before any request")
		assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.refusals))

		webCred := credOf(t, web)
		web.Release()
		time.Sleep(time.Minute)
		api.Release() // web is now the least recently released
		db, err := c.Acquire(t.Context(), dbID)
		require.NoError(t, err, "room made by dropping an unheld identity")
		synctest.Wait()
		assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.evictions))
		assert.Equal(t, 2.0, testutil.ToFloat64(c.metrics.entries))
		assert.True(t, zeroed(webCred.Key), "the evicted key zeroed")

		api, err = c.Acquire(t.Context(), apiID)
		require.NoError(t, err)
		assert.Equal(t, 1, f.callsFor(apiID), "api was kept: released last")
		_, err = c.Acquire(t.Context(), webID)
		require.ErrorIs(t, err, ErrIdentityCacheFull, "db and api are held")
		db.Release()
		web, err = c.Acquire(t.Context(), webID)
		require.NoError(t, err)
		assert.Equal(t, 2, f.callsFor(webID), "web was evicted: fetched again")
		web.Release()
		api.Release()
	})
}

// Once Run returns, Acquire fails and no renewal runs.
func TestIdentityCacheStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeFetcher(t, time.Hour)
		c := newTestCache(t, IdentityCacheConfig{Fetcher: f})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		h, err := c.Acquire(t.Context(), webID)
		require.NoError(t, err)
		cancel()
		require.NoError(t, <-done)
		_, err = c.Acquire(t.Context(), apiID)
		assert.ErrorIs(t, err, ErrIdentityCacheStopped)
		assert.ErrorContains(t, c.Run(t.Context()), "twice")
		_, err = h.Credential(t.Context(), webID)
		assert.NoError(t, err, "the last certificate, until it expires")
		h.Release()
		time.Sleep(2 * time.Hour)
		assert.Equal(t, 1, f.callsFor(webID))
	})
}

// Acquire before Run waits for it; a caller that gives up first is
// told why.
func TestIdentityCacheAcquireWaitsForRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestCache(t, IdentityCacheConfig{Fetcher: newFakeFetcher(t, time.Hour)})
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := c.Acquire(ctx, webID)
		assert.ErrorIs(t, err, context.DeadlineExceeded)

		_, err = c.Acquire(t.Context(), spiffeid.RequireFromString("spiffe://a.test"))
		assert.ErrorContains(t, err, "not a SPIFFE ID of a workload")

		got := make(chan error, 1)
		go func() {
			h, err := c.Acquire(context.Background(), webID)
			if err == nil {
				h.Release()
			}
			got <- err
		}()
		synctest.Wait()
		startServing(t, c.Run)
		assert.NoError(t, <-got)
	})
}

var errBoom = errors.New("boom")

func TestFetchResult(t *testing.T) {
	for err, want := range map[error]string{
		nil: "success",
		status.Error(codes.PermissionDenied, "x"): "refused",
		status.Error(codes.Unauthenticated, "x"):  "refused",
		status.Error(codes.Unavailable, "x"):      "unavailable",
		context.DeadlineExceeded:                  "unavailable",
		context.Canceled:                          "canceled",
		errUnusable:                               "unusable",
		errBoom:                                   "error",
	} {
		assert.Equal(t, want, fetchResult(err), "%v", err)
	}
}
