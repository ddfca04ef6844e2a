package crdcontroller

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
)

var gvr = schema.GroupVersionResource{Group: "example.dev", Version: "v1", Resource: "widgets"}

func widget(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("example.dev/v1")
	u.SetKind("Widget")
	u.SetName(name)
	return u
}

func newDynamic(objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "WidgetList"}, objs...)
}

// syncs records what each Sync call listed.
type syncs struct {
	mu       sync.Mutex
	lists    [][]string
	recorder events.EventRecorder
	fail     int // the next fail calls return an error
}

func (s *syncs) sync(_ context.Context, l Lister, recorder events.EventRecorder) error {
	objs, err := l.List(labels.Everything())
	if err != nil {
		return err
	}
	var names []string
	for _, o := range objs {
		names = append(names, o.(*unstructured.Unstructured).GetName())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lists, s.recorder = append(s.lists, names), recorder
	if s.fail > 0 {
		s.fail--
		return errors.New("sync refused")
	}
	return nil
}

func (s *syncs) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.lists)
}

func (s *syncs) last() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.lists) == 0 {
		return nil
	}
	return s.lists[len(s.lists)-1]
}

// start runs Run in the background; stop cancels it, waits for it to
// return nil and checks that no goroutine is left.
func start(t *testing.T, cfg Config) (stop func()) {
	t.Helper()
	opts := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	return func() {
		cancel()
		require.NoError(t, <-done)
		goleak.VerifyNone(t, opts)
	}
}

// Run syncs once the cache holds what exists, again after each change and
// on every tick of the clock.
func TestRunSyncsOnStartChangeAndTick(t *testing.T) {
	dyn := newDynamic(widget("a"))
	clk := clocktesting.NewFakeClock(time.Unix(1700000000, 0))
	s := &syncs{}
	stop := start(t, Config{Dynamic: dyn, GVR: gvr, Kind: "Widget", Interval: time.Minute, Clock: clk, Sync: s.sync})
	defer stop()

	require.EventuallyWithT(t, func(c *assert.CollectT) { assert.Equal(c, []string{"a"}, s.last()) }, 5*time.Second, 5*time.Millisecond)
	assert.Nil(t, s.recorder, "no Events client, no recorder")

	_, err := dyn.Resource(gvr).Create(context.Background(), widget("b"), metav1.CreateOptions{})
	require.NoError(t, err)
	require.EventuallyWithT(t, func(c *assert.CollectT) { assert.ElementsMatch(c, []string{"a", "b"}, s.last()) }, 5*time.Second, 5*time.Millisecond)

	require.Eventually(t, clk.HasWaiters, 5*time.Second, 5*time.Millisecond, "the ticker is set")
	n := s.count()
	clk.Step(time.Minute)
	require.Eventually(t, func() bool { return s.count() > n }, 5*time.Second, 5*time.Millisecond, "a tick syncs with nothing changed")
}

// A failed sync is counted, logged and retried without a change or tick.
func TestRunRetriesFailedSync(t *testing.T) {
	errs := prometheus.NewCounter(prometheus.CounterOpts{Name: "test_sync_errors_total"})
	s := &syncs{fail: 2}
	clk := clocktesting.NewFakeClock(time.Unix(1700000000, 0))
	stop := start(t, Config{Dynamic: newDynamic(widget("a")), GVR: gvr, Interval: time.Hour, Clock: clk, Sync: s.sync, SyncErrors: errs})
	defer stop()

	require.Eventually(t, func() bool { return s.count() >= 3 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, 2.0, testutil.ToFloat64(errs))
	assert.Equal(t, []string{"a"}, s.last(), "the retry lists again")
}

// With an Events client, Sync gets a recorder whose events reach the API.
func TestRunRecordsEvents(t *testing.T) {
	kube := kubefake.NewClientset()
	s := &syncs{}
	stop := start(t, Config{Dynamic: newDynamic(), GVR: gvr, Events: kube, Interval: time.Hour, Clock: clocktesting.NewFakeClock(time.Now()), Sync: s.sync})
	defer stop()

	require.Eventually(t, func() bool { return s.count() > 0 }, 5*time.Second, 5*time.Millisecond)
	s.mu.Lock()
	rec := s.recorder
	s.mu.Unlock()
	require.NotNil(t, rec)
	obj := widget("a")
	obj.SetNamespace("default")
	rec.Eventf(obj, nil, "Warning", "Invalid", "Apply", "%s", "spec.x is wrong")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		list, err := kube.EventsV1().Events("default").List(context.Background(), metav1.ListOptions{})
		if assert.NoError(c, err) && assert.Len(c, list.Items, 1) {
			assert.Equal(c, "spec.x is wrong", list.Items[0].Note)
			assert.Equal(c, "trustbridge", list.Items[0].ReportingController)
		}
	}, 5*time.Second, 5*time.Millisecond)
}

func TestRunRefusesIncompleteConfig(t *testing.T) {
	sync := func(context.Context, Lister, events.EventRecorder) error { return nil }
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no dynamic", Config{GVR: gvr, Interval: time.Second, Sync: sync}},
		{"no sync", Config{Dynamic: newDynamic(), GVR: gvr, Interval: time.Second}},
		{"no interval", Config{Dynamic: newDynamic(), GVR: gvr, Sync: sync}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Run(context.Background(), tc.cfg)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "required")
		})
	}
}

// A context that ends before the cache synced ends Run without error and
// without a sync.
func TestRunEndsBeforeCacheSync(t *testing.T) {
	opts := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s := &syncs{}
	require.NoError(t, Run(ctx, Config{Dynamic: newDynamic(widget("a")), GVR: gvr, Interval: time.Second, Sync: s.sync}))
	assert.Zero(t, s.count())
	goleak.VerifyNone(t, opts)
}
