package kubeloop

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

type widgetStatus struct {
	State string `json:"state,omitempty"`
}

func TestUpdateStatus(t *testing.T) {
	obj := widget("a")
	dyn := newDynamic(obj)
	written, err := UpdateStatus(context.Background(), dyn.Resource(gvr), obj, &widgetStatus{State: "ok"})
	require.NoError(t, err)
	assert.True(t, written)
	got, err := dyn.Resource(gvr).Get(context.Background(), "a", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"state": "ok"}, got.Object["status"])
	assert.NotContains(t, obj.Object, "status", "the caller's object is not changed")
}

func TestUpdateStatusFailures(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		wantErr string
	}{
		{"deleted meanwhile", apierrors.NewNotFound(gvr.GroupResource(), "a"), ""},
		{"refused", errors.New("etcd is down"), "etcd is down"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := widget("a")
			dyn := newDynamic(obj)
			dyn.PrependReactor("update", "widgets", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, tc.err })
			written, err := UpdateStatus(context.Background(), dyn.Resource(gvr), obj, &widgetStatus{State: "ok"})
			assert.False(t, written)
			if tc.wantErr == "" {
				assert.NoError(t, err)
			} else {
				assert.ErrorContains(t, err, tc.wantErr)
			}
		})
	}
}

func TestNewMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := MetricsOpts{Prefix: "test_widget", ResourcesHelp: "r", StatusWritesHelp: "w", SyncErrorsHelp: "e"}
	m, err := NewMetrics(reg, opts)
	require.NoError(t, err)
	m.Resources.WithLabelValues("applied").Set(2)
	m.StatusWrites.Inc()
	m.SyncErrors.Inc()
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP test_widget_resources r
# TYPE test_widget_resources gauge
test_widget_resources{state="applied"} 2
# HELP test_widget_status_writes_total w
# TYPE test_widget_status_writes_total counter
test_widget_status_writes_total 1
# HELP test_widget_sync_errors_total e
# TYPE test_widget_sync_errors_total counter
test_widget_sync_errors_total 1
`)))
	_, err = NewMetrics(reg, opts)
	assert.Error(t, err, "the same names twice on one registry")
}
