package kubestore

import (
	"go.uber.org/goleak"

	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/kube/leader"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(kubetest.Tests(m)) }

var (
	td = spiffeid.RequireTrustDomainFromString("example.org")
	t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
)

type flag struct{ v atomic.Bool }

func (f *flag) IsLeader() bool { return f.v.Load() }
func leaderFlag(v bool) *flag {
	f := &flag{}
	f.v.Store(v)
	return f
}

func newStore(t *testing.T, cs kubernetes.Interface, ns string, l castate.Leader) *Store {
	t.Helper()
	s, err := New(Config{Client: cs, Namespace: ns, Leader: l})
	require.NoError(t, err)
	return s
}

func authorityConfig(clk clock.Clock, b castate.Backend, l castate.Leader) ca.Config {
	return ca.Config{
		TrustDomain: td, Backend: b, Leader: l,
		RootTTL: 24 * time.Hour, RefreshHint: time.Minute, WorkloadTTL: time.Hour, MaxWorkloadTTL: 2 * time.Hour,
		Clock: clk, Registerer: prometheus.NewRegistry(),
	}
}

func newAuthority(t *testing.T, clk clock.Clock, b castate.Backend, l castate.Leader) *ca.Authority {
	t.Helper()
	a, err := ca.New(authorityConfig(clk, b, l))
	require.NoError(t, err)
	return a
}

func secret(t *testing.T, cs kubernetes.Interface, ns string) *corev1.Secret {
	t.Helper()
	sec, err := cs.CoreV1().Secrets(ns).Get(context.Background(), DefaultName, metav1.GetOptions{})
	require.NoError(t, err)
	return sec
}

func journalOf(t *testing.T, sec *corev1.Secret) *castate.Journal {
	t.Helper()
	j, err := castate.DecodeJournal(sec.Data[castate.JournalKey], "example.org")
	require.NoError(t, err)
	return j
}

func serials(a *ca.Authority) []string {
	var out []string
	for _, c := range a.Bundle().X509Authorities() {
		out = append(out, c.SerialNumber.Text(16))
	}
	sort.Strings(out)
	return out
}

func workloadCSR(t *testing.T, id spiffeid.ID) *x509.CertificateRequest {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{id.URL()}}, testca.NewKey(t, testca.ECP256))
	require.NoError(t, err)
	csr, err := ca.ParseCSR(der)
	require.NoError(t, err)
	return csr
}

func TestSecretRoundTrip(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	clk := clocktesting.NewFakeClock(t0)
	a := newAuthority(t, clk, newStore(t, env.Client, ns, nil), nil)
	require.NoError(t, a.Ready())

	sec := secret(t, env.Client, ns)
	assert.Equal(t, corev1.SecretTypeOpaque, sec.Type)
	assert.Equal(t, "trustbridge", sec.Labels[ManagedByLabel])
	id := a.Roots()[0].ID
	var keys []string
	for k := range sec.Data {
		keys = append(keys, k)
	}
	kid := a.JWTKeys()[0].KID
	assert.ElementsMatch(t, []string{"state.json", id + ".crt.pem", id + ".key.pem", "jwt-" + kid + ".key.pem"}, keys)
	assert.Equal(t, uint64(t0.Unix()), journalOf(t, sec).Sequence)

	// A restart of the single replica (it leads) loads the same roots and
	// publishes them under a new sequence, once: the Secret could be a
	// restored copy.
	b := newAuthority(t, clk, newStore(t, env.Client, ns, nil), nil)
	started := secret(t, env.Client, ns)
	assert.Equal(t, uint64(t0.Unix())+1, journalOf(t, started).Sequence)
	require.NoError(t, a.Reload())
	assert.True(t, a.Bundle().Equal(b.Bundle()))
	require.Len(t, b.JWTKeys(), 1)
	assert.Equal(t, kid, b.JWTKeys()[0].KID, "the JWT key comes back from the Secret")
	_, _, err := b.SignJWT(spiffeid.RequireFromPath(td, "/w"), []string{"aud"}, 0)
	require.NoError(t, err)
	require.NoError(t, b.Reconcile())
	assert.Equal(t, started.ResourceVersion, secret(t, env.Client, ns).ResourceVersion, "a check with nothing due writes nothing")

	require.NoError(t, prepareRoot(b))
	require.NoError(t, a.Reload())
	assert.True(t, a.Bundle().Equal(b.Bundle()))
	assert.Equal(t, uint64(t0.Unix())+2, a.Sequence())
}

// racing runs before() once, before its first Commit: another writer that
// gets in between this one's load and commit.
type racing struct {
	*Store
	before func()
	fired  atomic.Bool
}

func (r *racing) Commit(base string, j *castate.Journal, roots []*castate.Root, jwtKeys []*castate.JWTKey) (string, error) {
	if r.fired.CompareAndSwap(false, true) {
		r.before()
	}
	return r.Store.Commit(base, j, roots, jwtKeys)
}

func TestConflictBetweenTwoWriters(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	clk := clocktesting.NewFakeClock(t0)
	a := newAuthority(t, clk, newStore(t, env.Client, ns, nil), nil)
	rb := &racing{Store: newStore(t, env.Client, ns, nil), before: func() {}}
	b := newAuthority(t, clk, rb, nil) // its first write (a new sequence) is not raced
	rb.before = func() { require.NoError(t, prepareRoot(a)) }
	rb.fired.Store(false)

	// b decides to rotate; a rotates first. b's write conflicts, b reloads,
	// finds a's successor waiting and does nothing more.
	require.NoError(t, prepareRoot(b))
	j := journalOf(t, secret(t, env.Client, ns))
	require.Len(t, j.Roots, 2, "one rotation, not two")
	assert.Equal(t, uint64(t0.Unix())+2, j.Sequence, "bootstrap, b's start, one rotation")
	assert.Equal(t, serials(a), serials(b), "the loser serves the winner's state")

	t.Run("stale commit writes nothing", func(t *testing.T) {
		s := newStore(t, env.Client, ns, nil)
		j, roots, keys, v, err := s.Load("example.org")
		require.NoError(t, err)
		require.NoError(t, prepareRoot(a)) // no-op: a root waits
		clk.Step(10 * time.Minute)
		require.NoError(t, a.Reconcile()) // activates: a new version
		before := secret(t, env.Client, ns)
		require.NotEqual(t, v, before.ResourceVersion)
		j.Sequence += 10
		_, err = s.Commit(v, j, roots, keys)
		require.ErrorIs(t, err, castate.ErrConflict)
		assert.Equal(t, before.ResourceVersion, secret(t, env.Client, ns).ResourceVersion)
		_, err = s.Commit("", j, roots, keys)
		require.ErrorIs(t, err, castate.ErrConflict, "a create over an existing Secret")
	})
}

func TestCorruptSecretRefusedAndLeftAlone(t *testing.T) {
	env := kubetest.Shared(t)
	tests := []struct {
		name   string
		break_ func(sec *corev1.Secret, id, kid string)
		want   string
	}{
		{"JWT key missing", func(sec *corev1.Secret, _, kid string) { delete(sec.Data, "jwt-"+kid+".key.pem") }, "is missing"},
		{"JWT key swapped", func(sec *corev1.Secret, id, kid string) {
			sec.Data["jwt-"+kid+".key.pem"] = sec.Data[id+".key.pem"]
		}, "does not match the kid"},
		{"journal does not parse", func(sec *corev1.Secret, _, _ string) { sec.Data["state.json"] = []byte(`{"format":1,`) }, "does not parse"},
		{"journal missing", func(sec *corev1.Secret, _, _ string) { delete(sec.Data, "state.json") }, "state.json is missing"},
		{"key missing", func(sec *corev1.Secret, id, _ string) { delete(sec.Data, id+".key.pem") }, "is missing"},
		{"key swapped", func(sec *corev1.Secret, id, _ string) {
			sec.Data[id+".key.pem"] = sec.Data[id+".crt.pem"]
		}, "private key"},
		{"unknown key", func(sec *corev1.Secret, _, _ string) { sec.Data["extra"] = []byte("x") }, `key "extra" is not part of the CA state`},
		{"other trust domain", func(sec *corev1.Secret, _, _ string) {
			var j map[string]any
			_ = json.Unmarshal(sec.Data["state.json"], &j)
			j["trust_domain"] = "other.org"
			sec.Data["state.json"], _ = json.Marshal(j)
		}, `it holds the CA of trust domain "other.org", not "example.org"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := env.Namespace(t)
			clk := clocktesting.NewFakeClock(t0)
			running := newAuthority(t, clk, newStore(t, env.Client, ns, nil), nil)
			bundle := running.Bundle()
			sec := secret(t, env.Client, ns)
			tt.break_(sec, running.Roots()[0].ID, running.JWTKeys()[0].KID)
			sec, err := env.Client.CoreV1().Secrets(ns).Update(context.Background(), sec, metav1.UpdateOptions{})
			require.NoError(t, err)

			_, err = ca.New(authorityConfig(clk, newStore(t, env.Client, ns, nil), nil))
			require.ErrorIs(t, err, castate.ErrCorruptState)
			assert.ErrorContains(t, err, tt.want)

			// A running replica keeps what it serves and says why.
			clk.Step(12 * time.Hour) // a rotation is due
			err = running.Reconcile()
			require.ErrorIs(t, err, castate.ErrCorruptState)
			assert.True(t, bundle.Equal(running.Bundle()), "last good bundle kept")
			assert.Equal(t, sec.ResourceVersion, secret(t, env.Client, ns).ResourceVersion, "never overwritten")
		})
	}

	t.Run("foreign type", func(t *testing.T) {
		ns := env.Namespace(t)
		_, err := env.Client.CoreV1().Secrets(ns).Create(context.Background(), &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: DefaultName}, Type: "example.com/other", Data: map[string][]byte{"a": []byte("b")},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = ca.New(authorityConfig(clocktesting.NewFakeClock(t0), newStore(t, env.Client, ns, nil), nil))
		require.ErrorIs(t, err, castate.ErrCorruptState)
		assert.ErrorContains(t, err, `type is "example.com/other"`)
	})

	t.Run("empty Secret made by an operator is adopted", func(t *testing.T) {
		ns := env.Namespace(t)
		_, err := env.Client.CoreV1().Secrets(ns).Create(context.Background(), &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: DefaultName, Annotations: map[string]string{"owner": "ops"}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		a := newAuthority(t, clocktesting.NewFakeClock(t0), newStore(t, env.Client, ns, nil), nil)
		require.NoError(t, a.Ready())
		sec := secret(t, env.Client, ns)
		assert.Equal(t, "ops", sec.Annotations["owner"], "what others set is kept")
		assert.Len(t, sec.Data, 4, "journal, root certificate and key, JWT key")
	})
}

func TestDecodeRefusesOversizedSecret(t *testing.T) {
	sec := &corev1.Secret{Data: map[string][]byte{"state.json": make([]byte, MaxSecretSize+1)}}
	_, err := decode(sec, "")
	require.ErrorIs(t, err, castate.ErrCorruptState)
	assert.ErrorContains(t, err, "more than")
}

func TestNonLeaderWriteRefused(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	s := newStore(t, env.Client, ns, leaderFlag(false))
	_, err := s.Commit("", &castate.Journal{TrustDomain: "example.org"}, nil, nil)
	require.ErrorIs(t, err, castate.ErrNotLeader)
	_, err = env.Client.CoreV1().Secrets(ns).Get(context.Background(), DefaultName, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "nothing written")

	// An Authority that follows on it never bootstraps.
	a := newAuthority(t, clocktesting.NewFakeClock(t0), s, leaderFlag(false))
	require.Error(t, a.Ready())
	_, err = env.Client.CoreV1().Secrets(ns).Get(context.Background(), DefaultName, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err))
}

func TestFollowerReloadsThroughTheWatch(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	clk := clock.RealClock{}
	fs := newStore(t, env.Client, ns, leaderFlag(false))
	follower := newAuthority(t, clk, fs, leaderFlag(false))
	require.Error(t, follower.Ready(), "no state yet")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- follower.Run(ctx) }()
	go func() { done <- fs.Watch(ctx, follower.Recheck) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, <-done)
	})

	leaderAuth := newAuthority(t, clk, newStore(t, env.Client, ns, leaderFlag(true)), leaderFlag(true))
	require.Eventually(t, func() bool { return follower.Ready() == nil }, 10*time.Second, 10*time.Millisecond)
	assert.True(t, leaderAuth.Bundle().Equal(follower.Bundle()))

	id := spiffeid.RequireFromPath(td, "/w")
	res, err := follower.SignX509SVID(ca.X509SVIDParams{PublicKey: workloadCSR(t, id).PublicKey, SPIFFEID: id})
	require.NoError(t, err)
	assert.True(t, res.Chain[len(res.Chain)-1].Equal(leaderAuth.Roots()[0].Cert) ||
		res.Leaf.Issuer.String() == leaderAuth.Roots()[0].Cert.Subject.String(), "signed with the leader's active root")

	require.NoError(t, prepareRoot(leaderAuth))
	require.Eventually(t, func() bool { return len(follower.Bundle().X509Authorities()) == 2 }, 10*time.Second, 10*time.Millisecond)
	assert.True(t, leaderAuth.Bundle().Equal(follower.Bundle()))
	require.ErrorIs(t, prepareRoot(follower), castate.ErrNotLeader)
}

// TestFailoverWithoutLostOrDuplicatedRotation: two replicas, each with an
// Elector and an Authority on one Secret. A forced rotation before the
// failover and one after leave exactly the expected roots and sequence.
func TestFailoverWithoutLostOrDuplicatedRotation(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	clk := clocktesting.NewFakeClock(t0)

	type replica struct {
		el   *leader.Elector
		a    *ca.Authority
		stop func()
	}
	start := func(id string) *replica {
		el, err := leader.New(leader.Config{Client: env.Client, Namespace: ns, Identity: id,
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond,
			Registerer: prometheus.NewRegistry()})
		require.NoError(t, err)
		r := &replica{el: el}
		r.a = newAuthority(t, clk, newStore(t, env.Client, ns, el), el)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- el.Run(ctx, func(ctx context.Context) error { <-ctx.Done(); return nil })
		}()
		var once sync.Once
		r.stop = func() { once.Do(func() { cancel(); require.NoError(t, <-done) }) }
		t.Cleanup(r.stop)
		return r
	}
	r1, r2 := start("one"), start("two")
	require.Eventually(t, func() bool { return r1.el.IsLeader() || r2.el.IsLeader() }, 20*time.Second, 10*time.Millisecond)
	first, second := r1, r2
	if r2.el.IsLeader() {
		first, second = r2, r1
	}

	// The first leader bootstraps and rotates; the follower follows.
	require.NoError(t, first.a.Reconcile())
	require.NoError(t, prepareRoot(first.a))
	require.NoError(t, second.a.Reconcile())
	require.Len(t, second.a.Roots(), 2)
	require.ErrorIs(t, prepareRoot(second.a), castate.ErrNotLeader)

	// Failover.
	first.stop()
	require.Eventually(t, second.el.IsLeader, 10*time.Second, 10*time.Millisecond)
	require.ErrorIs(t, prepareRoot(first.a), castate.ErrNotLeader, "the old leader writes nothing")

	// The new leader activates the waiting root once its lead has passed,
	// then rotates again.
	clk.Step(5 * time.Minute)
	require.NoError(t, second.a.Reconcile())
	require.NoError(t, prepareRoot(second.a))
	require.NoError(t, first.a.Reconcile())

	j := journalOf(t, secret(t, env.Client, ns))
	assert.Equal(t, uint64(t0.Add(5*time.Minute).Unix())+1, j.Sequence,
		"bootstrap and one root before the failover, the new leader's first write at its time, one root after")
	var states []castate.RootState
	for _, r := range j.Roots {
		states = append(states, r.State)
	}
	assert.Equal(t, []castate.RootState{castate.StateRetired, castate.StateActive, castate.StatePrepared}, states)
	var events []string
	for _, e := range j.Events {
		events = append(events, e.Event)
	}
	assert.Equal(t, "bootstrap,JWT key bootstrap,prepared (forced),retired,activated,prepared (forced)", strings.Join(events, ","))
	assert.True(t, first.a.Bundle().Equal(second.a.Bundle()))
}

// TestTaintAndRevokeAcrossALeaderChange: the leader taints its old root
// in the Secret; the other replica, leading next, holds the taint and
// revokes it; the first, following again, publishes the revocation.
func TestTaintAndRevokeAcrossALeaderChange(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	clk := clocktesting.NewFakeClock(t0)
	oneLeads, twoLeads := leaderFlag(true), leaderFlag(false)
	one := newAuthority(t, clk, newStore(t, env.Client, ns, oneLeads), oneLeads)
	two := newAuthority(t, clk, newStore(t, env.Client, ns, twoLeads), twoLeads)
	old := one.Roots()[0].ID

	require.NoError(t, prepareRoot(one))
	_, err := one.ChangeAuthority(ca.AuthorityChange{Action: "activate", Now: true})
	require.NoError(t, err)
	_, err = one.ChangeAuthority(ca.AuthorityChange{Action: "taint", ID: old})
	require.NoError(t, err)
	_, err = two.ChangeAuthority(ca.AuthorityChange{Action: "revoke", ID: old})
	require.ErrorIs(t, err, castate.ErrNotLeader, "a follower changes nothing")

	oneLeads.v.Store(false)
	twoLeads.v.Store(true)
	require.NoError(t, two.Reload())
	for _, r := range two.Roots() {
		if r.ID == old {
			assert.False(t, r.TaintedAt.IsZero(), "the new leader holds the taint")
		}
	}
	clk.Step(time.Second)
	_, err = two.ChangeAuthority(ca.AuthorityChange{Action: "revoke", ID: old})
	require.NoError(t, err)
	require.NoError(t, one.Reload())
	assert.True(t, one.Bundle().Equal(two.Bundle()))
	assert.Len(t, one.Bundle().X509Authorities(), 1, "the revoked root left every replica's bundle")
	j := journalOf(t, secret(t, env.Client, ns))
	require.Len(t, j.Revoked, 1)
	assert.Equal(t, old, j.Revoked[0].Root.ID)
}

func TestNewChecksConfig(t *testing.T) {
	_, err := New(Config{Namespace: "x"})
	assert.ErrorContains(t, err, "client is required")
	_, err = New(Config{Client: fake.NewClientset()})
	assert.ErrorContains(t, err, "namespace is required")
	s, err := New(Config{Client: fake.NewClientset(), Namespace: "x"})
	require.NoError(t, err)
	assert.Equal(t, "Secret x/trustbridge-ca", s.Describe())
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"format":1,"trust_domain":"example.org"}`), []byte("x"))
	f.Add([]byte(`{"format":1,"trust_domain":"example.org","roots":[{"id":"ab","state":"active","cert_sha256":"00"}]}`), []byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"))
	f.Add([]byte(`{`), []byte(nil))
	f.Fuzz(func(t *testing.T, journal, material []byte) {
		sec := &corev1.Secret{Data: map[string][]byte{"state.json": journal, "ab.crt.pem": material, "ab.key.pem": material, "jwt-ab.key.pem": material}}
		st, err := decode(sec, "example.org")
		if err != nil || st == nil {
			return
		}
		if len(st.journal.Roots) != len(st.roots) || len(st.journal.JWTKeys) != len(st.jwtKeys) {
			t.Fatal("journal and material disagree")
		}
		for _, r := range st.roots {
			if r.Key == nil || r.Cert == nil {
				t.Fatal("root without material accepted")
			}
		}
		for _, k := range st.jwtKeys {
			if k.Key == nil {
				t.Fatal("JWT key without material accepted")
			}
		}
	})
}

// TestWatchErrorsAreLogged: a follower whose watch cannot list the Secret
// (here RBAC forbids it) says so in its log, instead of silently never
// noticing the leader's writes.
func TestWatchErrorsAreLogged(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	tok := env.ServiceAccountToken(t, ns, "nobody", nil, 10*time.Minute)
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = tok
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	logs := &testlog.Buffer{}
	s, err := New(Config{Client: cs, Namespace: ns, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Watch(ctx, func() {}) }()
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "watch of the CA state failed") && strings.Contains(logs.String(), "forbidden")
	}, 10*time.Second, 10*time.Millisecond, logs.String())
	cancel()
	require.NoError(t, <-done)
}

// TestWatchCacheHoldsNoKeyMaterial: the watch keeps only what it needs
// to notice a change; not the data, and not annotations, which may hold
// a copy of it (kubectl apply's last-applied-configuration).
func TestWatchCacheHoldsNoKeyMaterial(t *testing.T) {
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: DefaultName, Namespace: "ns", ResourceVersion: "7", UID: "u",
			Labels:        map[string]string{ManagedByLabel: "trustbridge"},
			Annotations:   map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"data":{"x.key.pem":"LS0tLS1CRUdJTiBQUklWQVRF"}}`},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
		},
		Data: map[string][]byte{"x.key.pem": []byte("-----BEGIN PRIVATE KEY-----")},
	}
	got, err := metadataOnly(sec)
	require.NoError(t, err)
	out := got.(*corev1.Secret)
	assert.Equal(t, "7", out.ResourceVersion)
	assert.Equal(t, DefaultName, out.Name)
	assert.Empty(t, out.Data)
	assert.Empty(t, out.Annotations)
	assert.Empty(t, out.ManagedFields)
	b, err := json.Marshal(out)
	require.NoError(t, err)
	assert.NotContains(t, string(b), "PRIVATE")
	assert.NotContains(t, string(b), "LS0tLS1CRUdJTiBQUklWQVRF")
}

// leaseUntil leads until a fixed instant, as an Elector whose renewals
// stopped succeeding.
type leaseUntil struct{ until time.Time }

func (l leaseUntil) IsLeader() bool          { return time.Now().Before(l.until) }
func (l leaseUntil) LeadingUntil() time.Time { return l.until }

// TestWriteAbandonedWhenTheLeaseMayBeGone: a commit that began while this
// replica led, but would land after it stops counting itself the leader
// (another replica may take over soon after), is abandoned, not written
// late.
func TestWriteAbandonedWhenTheLeaseMayBeGone(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	newAuthority(t, clocktesting.NewFakeClock(t0), newStore(t, env.Client, ns, nil), nil)
	before := secret(t, env.Client, ns)

	cs, err := kubernetes.NewForConfig(env.SlowWrites(3*time.Second, http.MethodPut))
	require.NoError(t, err)
	s := newStore(t, cs, ns, leaseUntil{until: time.Now().Add(500 * time.Millisecond)})
	j, roots, keys, version, err := s.Load("example.org")
	require.NoError(t, err)
	require.Equal(t, before.ResourceVersion, version)
	j.Sequence++
	_, err = s.Commit(version, j, roots, keys)
	require.Error(t, err)
	assert.ErrorIs(t, err, castate.ErrNotLeader)
	assert.Equal(t, before.ResourceVersion, secret(t, env.Client, ns).ResourceVersion, "nothing written")
}

// prepareRoot publishes a successor root now, as `ca authority prepare`
// does (a no-op while one waits).
func prepareRoot(a *ca.Authority) error {
	_, err := a.ChangeAuthority(ca.AuthorityChange{Action: "prepare"})
	return err
}
