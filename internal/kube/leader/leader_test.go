package leader

import (
	"go.uber.org/goleak"

	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(kubetest.Tests(m)) }

// Short timings: failover within about a lease duration.
const (
	lease = 3 * time.Second
	renew = 2 * time.Second
	retry = 200 * time.Millisecond
)

type replica struct {
	el      *Elector
	reg     *prometheus.Registry
	cancel  context.CancelFunc
	done    chan error
	leading atomic.Bool // lead is running
	leads   atomic.Int32
}

func start(t *testing.T, env *kubetest.Env, ns, id string) *replica {
	t.Helper()
	r := &replica{reg: prometheus.NewRegistry(), done: make(chan error, 1)}
	el, err := New(Config{Client: env.Client, Namespace: ns, Identity: id,
		LeaseDuration: lease, RenewDeadline: renew, RetryPeriod: retry, Registerer: r.reg})
	require.NoError(t, err)
	r.el = el
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		r.done <- el.Run(ctx, func(ctx context.Context) error {
			r.leads.Add(1)
			r.leading.Store(true)
			<-ctx.Done()
			r.leading.Store(false)
			return nil
		})
	}()
	t.Cleanup(r.stop)
	return r
}

func (r *replica) stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	<-r.done
	r.cancel = nil
}

func TestOneLeaderAndFailover(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	a := start(t, env, ns, "a")
	b := start(t, env, ns, "b")

	var first, second *replica
	require.Eventually(t, func() bool { return a.el.IsLeader() || b.el.IsLeader() }, 20*time.Second, 20*time.Millisecond)
	if a.el.IsLeader() {
		first, second = a, b
	} else {
		first, second = b, a
	}
	require.Eventually(t, first.leading.Load, 5*time.Second, 10*time.Millisecond)
	// One leader, held over several renewals: at each one the Lease
	// records, the other replica neither leads nor runs its lead.
	watchRenewals(t, env, ns, first.el.Identity(), 5, func() {
		assert.False(t, second.el.IsLeader())
		assert.False(t, second.leading.Load())
	})
	assert.True(t, first.el.IsLeader())
	until := first.el.LeadingUntil()
	assert.True(t, until.After(time.Now()) && !until.After(time.Now().Add(renew)), "leading until %s", until)
	assert.Zero(t, second.el.LeadingUntil())
	assert.Equal(t, 1.0, testutil.ToFloat64(first.el.gauge))
	assert.Equal(t, 0.0, testutil.ToFloat64(second.el.gauge))

	// The leader stops: it releases the Lease and the other takes over
	// within about a lease duration.
	first.stop()
	assert.False(t, first.el.IsLeader(), "false at once after losing")
	assert.False(t, first.leading.Load(), "lead returned before Run")
	require.Eventually(t, second.el.IsLeader, lease+2*time.Second, 20*time.Millisecond)
	require.Eventually(t, second.leading.Load, time.Second, 10*time.Millisecond)
	assert.Equal(t, 0.0, testutil.ToFloat64(first.el.gauge))
	assert.Equal(t, 1.0, testutil.ToFloat64(second.el.gauge))
}

// watchRenewals watches the Lease and calls check at each renewal by
// holder it records, until it has seen n; it fails if the Lease changes
// hands meanwhile.
func watchRenewals(t *testing.T, env *kubetest.Env, ns, holder string, n int, check func()) {
	t.Helper()
	// A bound on failure only: the holder renews every retry period.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	w, err := env.Client.CoordinationV1().Leases(ns).Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", DefaultName).String(),
	})
	require.NoError(t, err)
	defer w.Stop()
	var last *metav1.MicroTime
	for seen := 0; seen < n; {
		ev, ok := <-w.ResultChan()
		require.True(t, ok, "watch ended after %d of %d renewals: %v", seen, n, ctx.Err())
		l, ok := ev.Object.(*coordinationv1.Lease)
		require.True(t, ok, "watch event %s: %v", ev.Type, ev.Object)
		require.Equal(t, holder, ptr.Deref(l.Spec.HolderIdentity, ""), "the Lease changed hands")
		if rt := l.Spec.RenewTime; rt != nil && last != nil && !rt.Equal(last) {
			seen++
			check()
		}
		last = l.Spec.RenewTime
	}
}

// TestLeaseTakenOverStopsLead: another holder takes the Lease (as after a
// network partition): the leader's renewals fail, IsLeader turns false
// within the renew deadline, its lead ends, and it campaigns again and
// leads once the other holder lets the Lease expire.
func TestLeaseTakenOverStopsLead(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	a := start(t, env, ns, "a")
	require.Eventually(t, a.el.IsLeader, 20*time.Second, 20*time.Millisecond)
	require.Eventually(t, a.leading.Load, 5*time.Second, 10*time.Millisecond)

	ctx, cancel := context.WithCancel(context.Background())
	intruderDone := make(chan struct{})
	go func() {
		defer close(intruderDone)
		for ctx.Err() == nil {
			l, err := env.Client.CoordinationV1().Leases(ns).Get(ctx, DefaultName, metav1.GetOptions{})
			if err == nil {
				holder, now := "intruder", metav1.NewMicroTime(time.Now())
				secs := int32(lease / time.Second)
				l.Spec.HolderIdentity, l.Spec.RenewTime, l.Spec.LeaseDurationSeconds = &holder, &now, &secs
				_, _ = env.Client.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{})
			}
			select {
			case <-ctx.Done():
			case <-time.After(retry / 2):
			}
		}
	}()
	require.Eventually(t, func() bool { return !a.el.IsLeader() }, renew+time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return !a.leading.Load() }, 2*time.Second, 10*time.Millisecond, "lead cancelled")
	leads := a.leads.Load()

	cancel()
	<-intruderDone
	require.Eventually(t, a.el.IsLeader, lease+5*time.Second, 20*time.Millisecond, "campaigns again after a loss")
	require.Eventually(t, func() bool { return a.leads.Load() > leads }, 5*time.Second, 10*time.Millisecond)
}

func TestNewChecksConfig(t *testing.T) {
	cs := fake.NewClientset()
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no client", Config{Namespace: "x"}, "client is required"},
		{"no namespace", Config{Client: cs}, "namespace is required"},
		{"lease not longer than renew", Config{Client: cs, Namespace: "x", LeaseDuration: time.Second, RenewDeadline: time.Second}, "must be longer than the renew deadline"},
		{"renew too short for retry", Config{Client: cs, Namespace: "x", RenewDeadline: time.Second, RetryPeriod: time.Second}, "retry periods"},
		// The Lease records whole seconds, and other replicas count the
		// lease from that: 1.5s would be taken as 1s, shorter than the
		// renew deadline this replica trusts itself to lead for.
		{"lease not whole seconds", Config{Client: cs, Namespace: "x", LeaseDuration: 1500 * time.Millisecond, RenewDeadline: 1200 * time.Millisecond, RetryPeriod: 100 * time.Millisecond}, "whole number of seconds"},
		{"lease under a second", Config{Client: cs, Namespace: "x", LeaseDuration: 900 * time.Millisecond, RenewDeadline: 600 * time.Millisecond, RetryPeriod: 100 * time.Millisecond}, "whole number of seconds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			assert.ErrorContains(t, err, tt.want)
		})
	}
	e, err := New(Config{Client: cs, Namespace: "x"})
	require.NoError(t, err)
	assert.NotEmpty(t, e.Identity())
	assert.False(t, e.IsLeader())
	e2, err := New(Config{Client: cs, Namespace: "x"})
	require.NoError(t, err)
	assert.NotEqual(t, e.Identity(), e2.Identity(), "identities are unique per process")
}

// TestFailingLeadBacksOff: lead work that fails at once gives up the
// Lease; the replica campaigns again, but one retry period later, not in
// a tight acquire-release loop against the API server. It runs in a
// synctest bubble on a fake clientset, so the time it observes passes
// at once and exactly; one replica needs no resourceVersion conflicts,
// which the fake does not enforce.
func TestFailingLeadBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		el, err := New(Config{Client: fake.NewClientset(), Namespace: "ns", Identity: "a",
			LeaseDuration: lease, RenewDeadline: renew, RetryPeriod: retry, Registerer: prometheus.NewRegistry()})
		require.NoError(t, err)
		var leads atomic.Int32
		first := make(chan struct{})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- el.Run(ctx, func(context.Context) error {
				if leads.Add(1) == 1 {
					close(first)
				}
				return assert.AnError
			})
		}()
		<-first
		start := time.Now()
		// Bubble time moves only while every goroutine in the bubble is
		// blocked, so the count covers exactly five retry periods.
		time.Sleep(5 * retry)
		n, elapsed := leads.Load(), time.Since(start)
		cancel()
		require.NoError(t, <-done)
		assert.LessOrEqual(t, int(n), int(elapsed/retry)+2, "%d leads in %s", n, elapsed)
		assert.GreaterOrEqual(t, n, int32(2), "it campaigns again")
	})
}
