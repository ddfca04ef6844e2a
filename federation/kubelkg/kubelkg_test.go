package kubelkg

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trustbridge/trustbridge/internal/testkit/testlog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// TestMain fails the tests if a goroutine outlives them: Watch's informer
// must end with its context.
func TestMain(m *testing.M) { goleak.VerifyTestMain(kubetest.Tests(m)) }

const peer = "peer.example"

type flag struct{ v atomic.Bool }

func (f *flag) IsLeader() bool { return f.v.Load() }

func bundle(t *testing.T, td string, seq uint64) *spiffebundle.Bundle {
	t.Helper()
	b := testca.New(t, td).Bundle()
	b.SetSequenceNumber(seq)
	b.SetRefreshHint(5 * time.Minute)
	return b
}

func withSeq(b *spiffebundle.Bundle, seq uint64) *spiffebundle.Bundle {
	c := b.Clone()
	c.SetSequenceNumber(seq)
	return c
}

func lkgEntry(b *spiffebundle.Bundle) federation.LKGEntry {
	return federation.LKGEntry{TrustDomain: b.TrustDomain(), Bundle: b, ETag: `"e1"`, EndpointURL: "https://" + peer + "/bundle", FetchedAt: time.Unix(1700000000, 0).UTC()}
}

func TestNameIsAValidObjectNameForEveryTrustDomain(t *testing.T) {
	s, err := New(Config{Client: fake.NewClientset(), Namespace: "x"})
	require.NoError(t, err)
	tds := []string{"example.org", "a_b.example", "under_score", "-lead.dash-", "x", "a..b", "0", strings.Repeat("a", 250), strings.Repeat("a.", 120) + "b"}
	seen := map[string]string{}
	for _, name := range tds {
		td, err := spiffeid.TrustDomainFromString(name)
		require.NoError(t, err, name)
		n := s.Name(td)
		assert.Empty(t, validation.IsDNS1123Subdomain(n), "%q -> %q", name, n)
		assert.Equal(t, n, s.Name(td), "deterministic")
		if other, dup := seen[n]; dup {
			t.Errorf("%q and %q share %q", name, other, n)
		}
		seen[n] = name
	}
	ab := spiffeid.RequireTrustDomainFromString("a_b.example")
	a2 := spiffeid.RequireTrustDomainFromString("a-b.example")
	assert.NotEqual(t, s.Name(ab), s.Name(a2), "the same readable part, told apart by the hash")
	assert.True(t, strings.HasPrefix(s.Name(ab), "trustbridge-lkg-a-b-example-"))

	_, err = New(Config{Client: fake.NewClientset(), Namespace: "x", Prefix: "Bad_"})
	assert.ErrorContains(t, err, "prefix")
}

func TestRoundTripAndRefusals(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	s, err := New(Config{Client: env.Client, Namespace: ns})
	require.NoError(t, err)
	td := spiffeid.RequireTrustDomainFromString(peer)

	got, err := s.Load(td)
	require.NoError(t, err)
	assert.Nil(t, got, "none stored")

	b7 := bundle(t, peer, 7)
	require.NoError(t, s.Save(lkgEntry(b7)))
	got, err = s.Load(td)
	require.NoError(t, err)
	assert.True(t, b7.Equal(got.Bundle))
	assert.Equal(t, lkgEntry(b7).ETag, got.ETag)
	assert.Equal(t, lkgEntry(b7).EndpointURL, got.EndpointURL)
	assert.Equal(t, lkgEntry(b7).FetchedAt, got.FetchedAt)
	cm, err := env.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), s.Name(td), metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, peer, cm.Annotations[TrustDomainAnnotation])

	require.NoError(t, s.Save(lkgEntry(withSeq(b7, 8))))
	err = s.Save(lkgEntry(withSeq(b7, 6)))
	require.ErrorIs(t, err, ErrConflict, "never backwards")
	got, err = s.Load(td)
	require.NoError(t, err)
	seq, _ := got.Bundle.SequenceNumber()
	assert.Equal(t, uint64(8), seq)

	t.Run("non-leader write refused", func(t *testing.T) {
		f := &flag{}
		fs, err := New(Config{Client: env.Client, Namespace: ns, Leader: f})
		require.NoError(t, err)
		require.ErrorIs(t, fs.Save(lkgEntry(withSeq(b7, 9))), ErrNotLeader)
		got, err := s.Load(td)
		require.NoError(t, err)
		seq, _ := got.Bundle.SequenceNumber()
		assert.Equal(t, uint64(8), seq)
	})

	t.Run("another trust domain's keys are refused", func(t *testing.T) {
		other := spiffeid.RequireTrustDomainFromString("other.example")
		require.NoError(t, s.Save(lkgEntry(bundle(t, "other.example", 1))))
		// Copy other's ConfigMap content over peer's.
		src, err := env.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), s.Name(other), metav1.GetOptions{})
		require.NoError(t, err)
		dst, err := env.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), s.Name(td), metav1.GetOptions{})
		require.NoError(t, err)
		dst.Data = src.Data
		dst, err = env.Client.CoreV1().ConfigMaps(ns).Update(context.Background(), dst, metav1.UpdateOptions{})
		require.NoError(t, err)
		_, err = s.Load(td)
		assert.ErrorContains(t, err, `holds the bundle of trust domain "other.example", not "peer.example"`)

		dst.Annotations[TrustDomainAnnotation] = "other.example"
		dst, err = env.Client.CoreV1().ConfigMaps(ns).Update(context.Background(), dst, metav1.UpdateOptions{})
		require.NoError(t, err)
		_, err = s.Load(td)
		assert.ErrorContains(t, err, "annotation")
		err = s.Save(lkgEntry(withSeq(b7, 10)))
		assert.ErrorContains(t, err, "refusing to overwrite")
		after, err := env.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), s.Name(td), metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, dst.ResourceVersion, after.ResourceVersion, "left alone")
	})
}

// Remove deletes a trust domain's entry (federation remove): only the
// leader, only an entry that names that trust domain, and a missing one
// is no error. Through it Poller.Forget works on Kubernetes storage too.
func TestRemove(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	s, err := New(Config{Client: env.Client, Namespace: ns})
	require.NoError(t, err)
	td := spiffeid.RequireTrustDomainFromString(peer)
	require.NoError(t, s.Save(lkgEntry(bundle(t, peer, 7))))

	f := &flag{}
	follower, err := New(Config{Client: env.Client, Namespace: ns, Leader: f})
	require.NoError(t, err)
	require.ErrorIs(t, follower.Remove(td), ErrNotLeader)
	got, err := s.Load(td)
	require.NoError(t, err)
	require.NotNil(t, got, "a follower deletes nothing")

	other := spiffeid.RequireTrustDomainFromString("other.example")
	require.NoError(t, s.Save(lkgEntry(bundle(t, "other.example", 1))))
	cm, err := env.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), s.Name(other), metav1.GetOptions{})
	require.NoError(t, err)
	cm.Annotations[TrustDomainAnnotation] = "third.example"
	_, err = env.Client.CoreV1().ConfigMaps(ns).Update(context.Background(), cm, metav1.UpdateOptions{})
	require.NoError(t, err)
	assert.ErrorContains(t, s.Remove(other), "refusing to delete")

	require.NoError(t, s.Remove(td))
	got, err = s.Load(td)
	require.NoError(t, err)
	assert.Nil(t, got)
	require.NoError(t, s.Remove(td), "already gone")

	p, err := federation.NewPoller(federation.PollerConfig{LKG: s, Sink: &sink{}})
	require.NoError(t, err)
	require.NoError(t, s.Save(lkgEntry(bundle(t, peer, 8))))
	require.NoError(t, p.Forget(td))
	got, err = s.Load(td)
	require.NoError(t, err)
	assert.Nil(t, got, "Poller.Forget deletes through the store")
}

// TestFollowerPicksUpTheLeadersBundle: the leader saves what its poller
// accepted; a follower's poller, driven by the watch, takes it.
func TestFollowerPicksUpTheLeadersBundle(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	leaderFlag, followerFlag := &flag{}, &flag{}
	leaderFlag.v.Store(true)
	leaderStore, err := New(Config{Client: env.Client, Namespace: ns, Leader: leaderFlag})
	require.NoError(t, err)
	followerStore, err := New(Config{Client: env.Client, Namespace: ns, Leader: followerFlag})
	require.NoError(t, err)

	eps, err := federation.ParseEndpoints(peer + "|https://" + peer + "/bundle")
	require.NoError(t, err)
	sink := &sink{}
	follower, err := federation.NewPoller(federation.PollerConfig{Endpoints: eps, LKG: followerStore, Sink: sink, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	require.Empty(t, follower.LoadLastKnownGood())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- followerStore.Watch(ctx, func(td spiffeid.TrustDomain) {
			if err := follower.LoadLastKnownGoodFor(td); err != nil {
				t.Log(err)
			}
		})
	}()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	b := bundle(t, peer, 7)
	require.NoError(t, leaderStore.Save(lkgEntry(b)))
	source := federation.SourceName(spiffeid.RequireTrustDomainFromString(peer))
	require.Eventually(t, func() bool { return b.Equal(sink.get(source)) }, 10*time.Second, 10*time.Millisecond)

	rotated := withSeq(bundle(t, peer, 1), 8)
	require.NoError(t, leaderStore.Save(lkgEntry(rotated)))
	require.Eventually(t, func() bool { return rotated.Equal(sink.get(source)) }, 10*time.Second, 10*time.Millisecond)
	require.ErrorIs(t, followerStore.Save(lkgEntry(withSeq(rotated, 9))), ErrNotLeader)
}

type sink struct {
	mu sync.Mutex
	m  map[string]*spiffebundle.Bundle
}

func (s *sink) Set(source string, b *spiffebundle.Bundle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]*spiffebundle.Bundle{}
	}
	s.m[source] = b
}

func (s *sink) Remove(source string, _ spiffeid.TrustDomain) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, source)
}

// X509BundleFor is what the poller wrote for td: the fetcher's roots.
func (s *sink) X509BundleFor(td spiffeid.TrustDomain) (*x509bundle.Bundle, bool) {
	if b := s.get(federation.SourceName(td)); b != nil {
		return b.X509Bundle(), true
	}
	return nil, false
}

func (s *sink) get(source string) *spiffebundle.Bundle {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[source]
}

func FuzzDecode(f *testing.F) {
	doc := `{"trust_domain":"peer.example","fetched_at":"2026-01-01T00:00:00Z","bundle":{"keys":[]}}`
	f.Add(doc, peer)
	f.Add(`{"trust_domain":"other.example","bundle":{"keys":[]}}`, peer)
	f.Add(`{`, peer)
	f.Add(`{"trust_domain":"peer.example","bundle":null}`, "x")
	f.Add(`{"trust_domain":"peer.example","bundle":{"keys":[]},"revoked":[{"use":"jwt-svid","kid":"k","exp":1767225600,"since":"2026-12-01T00:00:00Z"}]}`, peer)
	f.Add(`{"trust_domain":"peer.example","bundle":{"keys":[]},"revoked":[{"use":"jwt-svid","kid":"","exp":1}]}`, peer)
	td := spiffeid.RequireTrustDomainFromString(peer)
	f.Fuzz(func(t *testing.T, raw, annotation string) {
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{TrustDomainAnnotation: annotation}},
			Data:       map[string]string{EntryKey: raw},
		}
		e, err := decode(cm, td)
		if err != nil {
			return
		}
		if annotation != peer || e.TrustDomain != td || e.Bundle.TrustDomain() != td {
			t.Fatalf("entry for another trust domain accepted: %q", annotation)
		}
	})
}

// failingGets makes GETs of ConfigMaps fail while on, like an API server
// that is briefly unreachable for reads.
type failingGets struct {
	on   atomic.Bool
	next http.RoundTripper
}

func (f *failingGets) RoundTrip(r *http.Request) (*http.Response, error) {
	if f.on.Load() && r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/configmaps/") {
		return nil, errors.New("injected: connection refused")
	}
	return f.next.RoundTrip(r)
}

// TestFollowerRetriesALoadThatFailed: the watch tells a follower that an
// entry changed, but reading it fails (the API server blinked). The
// follower must still pick the bundle up later, not wait for the leader's
// next save, which may be days away.
func TestFollowerRetriesALoadThatFailed(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	leaderStore, err := New(Config{Client: env.Client, Namespace: ns})
	require.NoError(t, err)
	fail := &failingGets{}
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { fail.next = rt; return fail })
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	followerStore, err := New(Config{Client: cs, Namespace: ns, Leader: &flag{}, Resync: 100 * time.Millisecond})
	require.NoError(t, err)

	eps, err := federation.ParseEndpoints(peer + "|https://" + peer + "/bundle")
	require.NoError(t, err)
	sink := &sink{}
	follower, err := federation.NewPoller(federation.PollerConfig{Endpoints: eps, LKG: followerStore, Sink: sink, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	require.Empty(t, follower.LoadLastKnownGood())

	var failed atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- followerStore.Watch(ctx, func(td spiffeid.TrustDomain) {
			if err := follower.LoadLastKnownGoodFor(td); err != nil {
				failed.Add(1)
			}
		})
	}()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	fail.on.Store(true)
	b := bundle(t, peer, 7)
	require.NoError(t, leaderStore.Save(lkgEntry(b)))
	require.Eventually(t, func() bool { return failed.Load() > 0 }, 10*time.Second, 10*time.Millisecond, "the event came and its load failed")
	fail.on.Store(false)
	source := federation.SourceName(spiffeid.RequireTrustDomainFromString(peer))
	require.Eventually(t, func() bool { return b.Equal(sink.get(source)) }, 10*time.Second, 10*time.Millisecond)
}

// TestWatchErrorsAreLogged: a follower whose watch cannot list the
// entries (here RBAC forbids it) says so in its log.
func TestWatchErrorsAreLogged(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = env.ServiceAccountToken(t, ns, "nobody", nil, 10*time.Minute)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	logs := &testlog.Buffer{}
	s, err := New(Config{Client: cs, Namespace: ns, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Watch(ctx, func(spiffeid.TrustDomain) {}) }()
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "watch of last-known-good ConfigMaps failed") && strings.Contains(logs.String(), "forbidden")
	}, 10*time.Second, 10*time.Millisecond, logs.String())
	cancel()
	require.NoError(t, <-done)
}

// TestForeignRootRefused: an entry whose bundle holds a root naming another
// trust domain (an edited ConfigMap) is refused, as the poller refuses it
// when fetched: that root could mint identities of the trust domain it
// names. A follower keeps what it held.
func TestForeignRootRefused(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	s, err := New(Config{Client: env.Client, Namespace: ns})
	require.NoError(t, err)
	good := bundle(t, peer, 7)
	require.NoError(t, s.Save(lkgEntry(good)))

	peerTD := spiffeid.RequireTrustDomainFromString(peer)
	foreign := spiffebundle.FromX509Authorities(peerTD, testca.New(t, "evil.example").Bundle().X509Authorities())
	foreign.SetSequenceNumber(8)
	doc, err := bundledoc.Marshal(foreign)
	require.NoError(t, err)
	raw, err := json.Marshal(entry{TrustDomain: peer, FetchedAt: time.Now().UTC(), Bundle: doc})
	require.NoError(t, err)
	cm, err := env.Client.CoreV1().ConfigMaps(ns).Get(t.Context(), s.Name(peerTD), metav1.GetOptions{})
	require.NoError(t, err)
	cm.Data[EntryKey] = string(raw)
	_, err = env.Client.CoreV1().ConfigMaps(ns).Update(t.Context(), cm, metav1.UpdateOptions{})
	require.NoError(t, err)

	_, err = s.Load(peerTD)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "evil.example")

	eps, err := federation.ParseEndpoints(peer + "|https://" + peer + "/bundle")
	require.NoError(t, err)
	sk := &sink{}
	p, err := federation.NewPoller(federation.PollerConfig{Endpoints: eps, LKG: s, Sink: sk, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	errs := p.LoadLastKnownGood()
	require.Len(t, errs, 1)
	assert.Nil(t, sk.get(federation.SourceName(peerTD)), "nothing trusted from it")
}

// leaseUntil leads until a fixed instant, as an Elector whose renewals
// stopped succeeding.
type leaseUntil struct{ until time.Time }

func (l leaseUntil) IsLeader() bool          { return time.Now().Before(l.until) }
func (l leaseUntil) LeadingUntil() time.Time { return l.until }

// TestSaveAbandonedWhenTheLeaseMayBeGone: a save that began while this
// replica led, but would land after it stops counting itself the leader,
// is abandoned, not written late over a newer leader's.
func TestSaveAbandonedWhenTheLeaseMayBeGone(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	cs, err := kubernetes.NewForConfig(env.SlowWrites(3*time.Second, http.MethodPut, http.MethodPost))
	require.NoError(t, err)
	s, err := New(Config{Client: cs, Namespace: ns, Leader: leaseUntil{until: time.Now().Add(500 * time.Millisecond)}})
	require.NoError(t, err)
	err = s.Save(lkgEntry(bundle(t, peer, 7)))
	require.ErrorIs(t, err, ErrNotLeader)
	_, err = env.Client.CoreV1().ConfigMaps(ns).Get(t.Context(), s.Name(spiffeid.RequireTrustDomainFromString(peer)), metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "nothing written: %v", err)
}

// The revoked set (issue 38) persists with the entry, and entries written
// before it (no "revoked" member) still load.
func TestRevokedSetRoundTrip(t *testing.T) {
	s, err := New(Config{Client: fake.NewClientset(), Namespace: "x"})
	require.NoError(t, err)
	td := spiffeid.RequireTrustDomainFromString(peer)
	b := bundle(t, peer, 7)
	require.NoError(t, s.Save(lkgEntry(b)))
	got, err := s.Load(td)
	require.NoError(t, err)
	assert.Nil(t, got.Revoked)

	seq := uint64(8)
	gone := testca.New(t, peer).Cert
	e := lkgEntry(withSeq(b, 8))
	e.Revoked = []federation.Revoked{{Revocation: bundledoc.RevokeX509(gone), Sequence: &seq, Since: time.Unix(1700000000, 0).UTC()}}
	e.Revoked[0].NotAfter = e.Revoked[0].NotAfter.UTC()
	require.NoError(t, s.Save(e))
	got, err = s.Load(td)
	require.NoError(t, err)
	assert.Equal(t, e.Revoked, got.Revoked)
}
