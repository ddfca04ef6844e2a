package mapcrd

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// A node agent's controller (IsLeader false) applies the resources but
// writes no status and records no event: the agent may only read.
func TestSyncFollowerWritesNothing(t *testing.T) {
	dyn := kubetest.FakeDynamic(GVR, Kind+"List")
	for name, spec := range map[string]map[string]any{
		"good": {"workloads": []any{map[string]any{"namespace": "pay"}}, "spiffeID": "spiffe://{{.TrustDomain}}/pay"},
		"bad":  {"workloads": []any{map[string]any{"namespace": "web"}}, "spiffeID": "spiffe://other.org/web"},
	} {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": Group + "/" + Version, "kind": Kind,
			"metadata": map[string]any{"name": name, "generation": int64(1)}, "spec": spec}}
		_, err := dyn.Resource(GVR).Create(context.Background(), u, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	comb, err := identitymap.NewCombiner(identitymap.Config{TrustDomain: local}, identitymap.NewCell(nil))
	require.NoError(t, err)
	c, err := New(Config{Dynamic: dyn, Map: identitymap.Config{TrustDomain: local}, Apply: CombinerApplier(comb), Current: comb.Map,
		IsLeader: func() bool { return false }, Clock: clocktesting.NewFakeClock(time.Now()), Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	recorder := events.NewFakeRecorder(10)
	dyn.ClearActions()
	require.NoError(t, c.rules.Sync(context.Background(), kubetest.Lister{Res: dyn.Resource(GVR)}, recorder))
	<-c.Synced()
	require.Len(t, comb.Map().Rules(), 1)
	assert.Equal(t, "good", comb.Map().Rules()[0].Name)
	for _, a := range dyn.Actions() {
		assert.Equal(t, "list", a.GetVerb(), "a follower only reads: %v", a)
	}
	assert.Empty(t, recorder.Events)
	assert.Zero(t, testutil.ToFloat64(c.metrics.StatusWrites))
	assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.Resources.WithLabelValues("invalid")))
}

func TestNewRequires(t *testing.T) {
	_, err := New(Config{})
	assert.ErrorContains(t, err, "mapcrd: Dynamic, Apply and Map.TrustDomain are required")
}

// WatchSync warns once the resources have not been read in time, says
// when they are, and returns only when its context ends.
func TestWatchSync(t *testing.T) {
	dyn := kubetest.FakeDynamic(GVR, Kind+"List")
	comb, err := identitymap.NewCombiner(identitymap.Config{TrustDomain: local}, identitymap.NewCell(nil))
	require.NoError(t, err)
	clk := clocktesting.NewFakeClock(time.Now())
	var logs testlog.Buffer
	c, err := New(Config{Dynamic: dyn, Map: identitymap.Config{TrustDomain: local}, Apply: CombinerApplier(comb),
		Clock: clk, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.WatchSync(ctx, DefaultSyncWarn, "nothing is granted until they are") }()
	require.Eventually(t, clk.HasWaiters, 10*time.Second, time.Millisecond)
	clk.Step(DefaultSyncWarn)
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "resources not read yet: nothing is granted until they are")
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, c.rules.Sync(context.Background(), kubetest.Lister{Res: dyn.Resource(GVR)}, nil))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "resources read: the identity map is complete") }, 10*time.Second, time.Millisecond)
	select {
	case <-done:
		t.Fatal("WatchSync returned before its context ended")
	default:
	}
	cancel()
	assert.NoError(t, <-done)
}
