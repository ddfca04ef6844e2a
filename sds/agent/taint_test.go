package agent

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/loop"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

func TestTaintDelay(t *testing.T) {
	for _, tc := range []struct {
		name   string
		spread time.Duration
		r      float64
		want   time.Duration
	}{
		{"no spread: at once", 0, 0.7, 0},
		{"negative spread: at once", -time.Minute, 0.7, 0},
		{"start of the window", time.Minute, 0, 0},
		{"middle", time.Minute, 0.5, 30 * time.Second},
		{"never the end", time.Minute, math.Nextafter(1, 0), time.Minute - 1},
		{"a faulty r of 1 stays inside", time.Minute, 1, time.Minute - 1},
		{"NaN: at once", time.Minute, math.NaN(), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, taintDelay(tc.spread, tc.r))
		})
	}
}

// Delays drawn from math/rand/v2 fall in [0, spread) and cover it: every
// tenth of the window gets some of 10,000 workloads.
func TestTaintDelaySpreads(t *testing.T) {
	const spread, n = time.Minute, 10000
	rng := rand.New(rand.NewPCG(1, 2))
	var buckets [10]int
	for range n {
		d := taintDelay(spread, rng.Float64())
		require.GreaterOrEqual(t, d, time.Duration(0))
		require.Less(t, d, spread)
		buckets[d*10/spread]++
	}
	for i, b := range buckets {
		assert.InDelta(t, n/10, b, n/20, "tenth %d of the window", i)
	}
}

// taintFixture is two CAs of the trust domain: old, which gets tainted,
// and fresh, which signs once the CA has switched.
type taintFixture struct {
	old, fresh *testca.CA
}

func newTaintFixture(t *testing.T) *taintFixture {
	opts := testca.Options{NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(100 * 24 * time.Hour)}
	return &taintFixture{old: testca.New(t, tdA.Name(), opts), fresh: testca.New(t, tdA.Name(), opts)}
}

// taintOf is ca's root as a tainted authority, by key ID or by hash.
func taintOf(ca *testca.CA, byHash bool) caclient.TaintedAuthority {
	if byHash {
		sum := sha256.Sum256(ca.Cert.Raw)
		return caclient.TaintedAuthority{X509SHA256: sum[:]}
	}
	return caclient.TaintedAuthority{X509SubjectKeyID: ca.Cert.SubjectKeyId}
}

func TestTaintDue(t *testing.T) {
	f := newTaintFixture(t)
	now := time.Date(2026, 12, 7, 2, 0, 0, 0, time.UTC)
	oldLeaf, _ := f.old.Issue(t, webID)
	freshLeaf, _ := f.fresh.Issue(t, webID)
	set := taintSet{authorities: []caclient.TaintedAuthority{taintOf(f.old, false)}, spread: time.Minute, gen: 1}

	var d taintDue
	assert.True(t, d.onSet([]*x509.Certificate{oldLeaf}, set, now, 0.5))
	assert.Equal(t, now.Add(30*time.Second), d.at)
	assert.False(t, d.onSet([]*x509.Certificate{oldLeaf}, set, now, 0.9), "judged once per set: the delay is not drawn again")
	assert.False(t, d.take(now.Add(29*time.Second)))
	assert.True(t, d.take(now.Add(30*time.Second)))
	assert.False(t, d.take(now.Add(31*time.Second)), "taken once; a failure retries as a renewal does")

	// The re-issue came back from the CA's new authority: done, counted.
	assert.True(t, d.onIssued([]*x509.Certificate{freshLeaf}, set, now, loop.Backoff{Base: time.Second, Max: time.Minute}, 0.5))
	assert.True(t, d.at.IsZero())

	// Still signed by the tainted one: served, and asked again after a
	// growing backoff, never in a tight loop.
	var hot taintDue
	hot.onSet([]*x509.Certificate{oldLeaf}, set, now, 0)
	require.True(t, hot.take(now))
	assert.True(t, hot.onIssued([]*x509.Certificate{oldLeaf}, set, now, loop.Backoff{Base: time.Second, Max: time.Minute}, 1))
	assert.Equal(t, now.Add(time.Second), hot.at)
	require.True(t, hot.take(hot.at))
	assert.True(t, hot.onIssued([]*x509.Certificate{oldLeaf}, set, now, loop.Backoff{Base: time.Second, Max: time.Minute}, 1))
	assert.Equal(t, now.Add(2*time.Second), hot.at, "the backoff grows")

	// A later set that no longer taints it cancels the re-issue.
	assert.False(t, hot.onSet([]*x509.Certificate{oldLeaf}, taintSet{gen: 2}, now, 0.5))
	assert.True(t, hot.at.IsZero())
}

// switchFetcher issues from old until switched to fresh, as a CA that
// moves off a tainted authority; fail, when set, fails every request.
type switchFetcher struct {
	t testing.TB

	mu    sync.Mutex
	ca    *testca.CA
	fail  error
	calls int
}

func (f *switchFetcher) FetchX509SVID(_ context.Context, id spiffeid.ID, key crypto.Signer) ([]*x509.Certificate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.fail != nil {
		return nil, f.fail
	}
	return []*x509.Certificate{issueFor(f.t, f.ca, id, key.Public(), time.Now(), 24*time.Hour)}, nil
}

func (f *switchFetcher) set(ca *testca.CA, fail error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ca, f.fail = ca, fail
}

func (f *switchFetcher) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// byID fetches each identity from a fetcher of its own.
type byID map[spiffeid.ID]IdentityFetcher

func (b byID) FetchX509SVID(ctx context.Context, id spiffeid.ID, key crypto.Signer) ([]*x509.Certificate, error) {
	return b[id].FetchX509SVID(ctx, id, key)
}

// taintedCache is an identity cache whose web identity comes from web
// (the old CA first) and api identity from another CA, following a
// taint cell, with a fixed jitter of 0.5.
type taintedCache struct {
	*taintFixture
	web     *switchFetcher
	other   *testca.CA
	cache   *IdentityCache
	cell    *taintCell
	reissue prometheus.Counter
	logs    *testlog.Buffer
}

func newTaintedCache(t *testing.T) *taintedCache {
	f := &taintedCache{taintFixture: newTaintFixture(t), cell: &taintCell{}, logs: &testlog.Buffer{},
		reissue: prometheus.NewCounter(prometheus.CounterOpts{Name: "taint_reissues"})}
	f.web = &switchFetcher{t: t, ca: f.old}
	f.other = testca.New(t, tdA.Name())
	f.cache = newTestCache(t, IdentityCacheConfig{Fetcher: byID{webID: f.web, apiID: &switchFetcher{t: t, ca: f.other}}, Rand: fixedRand(0.5)})
	f.cache.taintReissues = f.reissue
	f.cell.follow(f.cache.setTaints)
	return f
}

// taint makes the old CA's root tainted, with spread.
func (f *taintedCache) taint(t *testing.T, spread time.Duration) {
	f.cell.take(&caclient.Bundles{Tainted: []caclient.TaintedAuthority{taintOf(f.old, false)}, ReissueSpread: spread}, slog.New(slog.NewTextHandler(f.logs, nil)))
	synctest.Wait()
}

// (a) and (b): the certificate a tainted authority signed is re-issued
// within the spread and the new one served; another is left alone.
func TestIdentityCacheReissuesTainted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTaintedCache(t)
		startServing(t, f.cache.Run)
		web, api := acquire(t, f.cache, webID), acquire(t, f.cache, apiID)
		oldWeb, oldAPI := credOf(t, web), credOf(t, api)
		require.Equal(t, f.old.Cert.SubjectKeyId, oldWeb.Chain[0].AuthorityKeyId)

		f.web.set(f.fresh, nil)
		f.taint(t, 10*time.Minute)
		assert.Contains(t, f.logs.String(), "credentials=1")
		assert.Contains(t, f.logs.String(), "spread=10m0s")
		time.Sleep(5*time.Minute - time.Second)
		synctest.Wait()
		assert.Same(t, oldWeb, credOf(t, web), "not before its point of the spread (0.5 of it)")

		time.Sleep(2 * time.Second)
		synctest.Wait()
		newWeb := credOf(t, web)
		assert.True(t, closed(oldWeb.Changed), "pushed to the streams as a renewal is")
		assert.Equal(t, f.fresh.Cert.SubjectKeyId, newWeb.Chain[0].AuthorityKeyId, "from the CA's new authority")
		assert.Same(t, oldAPI, credOf(t, api), "a certificate the taint does not name is left alone")
		assert.Equal(t, 1.0, testutil.ToFloat64(f.reissue))
		assert.Equal(t, 2, f.web.count())
	})
}

// (c): while the re-issue fails the old certificate is served, and the
// re-issue retried with the renewal's backoff until it succeeds.
func TestIdentityCacheKeepsTaintedWhileReissueFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTaintedCache(t)
		startServing(t, f.cache.Run)
		web := acquire(t, f.cache, webID)
		old := credOf(t, web)

		f.web.set(f.fresh, status.Error(codes.Unavailable, "the CA is down"))
		f.taint(t, 0)
		time.Sleep(30 * time.Second)
		synctest.Wait()
		assert.Same(t, old, credOf(t, web), "never left without a certificate")
		assert.Greater(t, f.web.count(), 2, "retried")
		assert.Zero(t, testutil.ToFloat64(f.reissue))

		f.web.set(f.fresh, nil)
		time.Sleep(identityRetryMax)
		synctest.Wait()
		assert.Equal(t, f.fresh.Cert.SubjectKeyId, credOf(t, web).Chain[0].AuthorityKeyId)
		assert.Equal(t, 1.0, testutil.ToFloat64(f.reissue), "counted once it succeeded")
	})
}

// A CA that still signs with the tainted authority is asked again with a
// growing backoff, not in a tight loop; the new certificate is served.
func TestIdentityCacheTaintedReissueBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTaintedCache(t)
		startServing(t, f.cache.Run)
		web := acquire(t, f.cache, webID)
		old := credOf(t, web)
		f.taint(t, 0)
		time.Sleep(time.Minute)
		synctest.Wait()
		// 1 + at once, then backoffs of about 1, 2, 4, 8, 16, 32 s.
		assert.LessOrEqual(t, f.web.count(), 9)
		assert.GreaterOrEqual(t, f.web.count(), 4)
		assert.NotSame(t, old, credOf(t, web), "the re-issued certificate is served: it is no worse")
	})
}

// (d): a JWT-SVID whose kid is tainted is dropped from the cache and
// never served again, so the next request mints from the new key; others
// are kept.
func TestJWTMinterDropsTaintedKeys(t *testing.T) {
	conn, err := grpc.NewClient("passthrough:///unused", grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	m := newNodeJWTMinter(conn, clocktesting.NewFakeClock(time.Now()), nil)
	cell := &taintCell{}
	m.followTaints(cell)
	exp := time.Now().Add(time.Hour)
	m.store("old", cachedJWT{token: fakeToken("old-kid"), refreshAt: exp, expAt: exp, kid: jwtsvid.KeyID(fakeToken("old-kid"))}, time.Now())
	m.store("new", cachedJWT{token: fakeToken("new-kid"), refreshAt: exp, expAt: exp, kid: jwtsvid.KeyID(fakeToken("new-kid"))}, time.Now())
	require.Equal(t, "old-kid", m.cache["old"].kid)

	cell.take(&caclient.Bundles{Tainted: []caclient.TaintedAuthority{{JWTKeyID: "old-kid"}}}, nil)
	assert.NotContains(t, m.cache, "old")
	assert.Contains(t, m.cache, "new")

	minted := 0
	call := func(context.Context, *caclient.JWTBatcher) (*caclient.JWTSVID, error) {
		minted++
		return &caclient.JWTSVID{Token: fakeToken("old-kid"), ExpiresAt: exp}, nil
	}
	tok, err := m.mint(t.Context(), "new", nil, call)
	require.NoError(t, err)
	assert.Equal(t, fakeToken("new-kid"), tok, "an untainted token is served from the cache")
	assert.Zero(t, minted)
	// A token of the tainted key that raced the taint into the cache is
	// not served either.
	for range 2 {
		_, err = m.mint(t.Context(), "raced", nil, call)
		require.NoError(t, err)
	}
	assert.Equal(t, 2, minted)
}

func fakeToken(kid string) string {
	head := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"ES256","kid":"` + kid + `","typ":"JWT"}`))
	return head + ".e30.c2ln"
}

func TestJWTKeyID(t *testing.T) {
	assert.Equal(t, "k1", jwtsvid.KeyID(fakeToken("k1")))
	for _, bad := range []string{"", "nodots", "!!!.e30.x", base64.RawURLEncoding.EncodeToString([]byte("[1]")) + ".e30.x"} {
		assert.Empty(t, jwtsvid.KeyID(bad), bad)
	}
}

// The cell tells its followers of a set once: the same set from another
// stream (every workload's carries it) changes nothing.
func TestTaintCellOncePerSet(t *testing.T) {
	var got []uint64
	cell := &taintCell{}
	cell.follow(func(s taintSet) int { got = append(got, s.gen); return 0 })
	logs := &testlog.Buffer{}
	b := &caclient.Bundles{Tainted: []caclient.TaintedAuthority{{JWTKeyID: "k"}}, ReissueSpread: time.Minute}
	cell.take(b, slog.New(slog.NewTextHandler(logs, nil)))
	cell.take(b, slog.New(slog.NewTextHandler(logs, nil)))
	cell.take(&caclient.Bundles{Tainted: []caclient.TaintedAuthority{{JWTKeyID: "k"}}, ReissueSpread: time.Minute}, slog.New(slog.NewTextHandler(logs, nil)))
	assert.Equal(t, []uint64{1}, got)
	cell.take(&caclient.Bundles{}, slog.New(slog.NewTextHandler(logs, nil)))
	assert.Equal(t, []uint64{1, 2}, got, "cleared")
	late := 0
	cell.follow(func(taintSet) int { late++; return 0 })
	assert.Equal(t, 1, late, "a late follower hears of the set in force")
}

// The Rotator re-issues its own certificate within the spread when a
// taint names the authority that signed it, pushes it to the cell as a
// renewal does, and counts it.
func TestRotatorReissuesTainted(t *testing.T) {
	f := newRotFixture(t)
	r := f.rotator(t, nil)
	reissues := prometheus.NewCounter(prometheus.CounterOpts{Name: "taint_reissues"})
	r.taintReissues = reissues
	require.NoError(t, r.Init(t.Context()))
	first := current(t, r)
	attempts := runRotator(t, r)

	untainted := taintSet{authorities: []caclient.TaintedAuthority{{JWTKeyID: "k"}}, spread: 10 * time.Minute, gen: 1}
	assert.Zero(t, r.setTaints(untainted), "a JWT key taints no certificate")
	set := taintSet{authorities: []caclient.TaintedAuthority{taintOf(f.svc.ca, false)}, spread: 10 * time.Minute, gen: 2}
	assert.Equal(t, 1, r.setTaints(set))
	// The delay is drawn in [0, 10m); Run may draw it before or after
	// a step, so step twice at most: still before the grace point (30m).
	var err error
	for i := 0; i < 2; i++ {
		f.clock.Step(10 * time.Minute)
		select {
		case err = <-attempts:
			i = 2
		case <-time.After(2 * time.Second):
			require.Less(t, i, 1, "no re-issue within the spread")
		}
	}
	require.NoError(t, err)
	waitClosed(t, first.Changed)
	assert.NotEqual(t, first.Chain[0].SerialNumber, current(t, r).Chain[0].SerialNumber)
	assert.Equal(t, 1.0, testutil.ToFloat64(reissues))
}
