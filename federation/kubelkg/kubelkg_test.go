package kubelkg

import (
	"context"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/kubetest"
	"github.com/trustbridge/trustbridge/internal/testca"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

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
