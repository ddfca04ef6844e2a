package distribution

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Results of trustbridge_distribution_writes_total.
const (
	resultCreated  = "created"
	resultUpdated  = "updated"
	resultDeleted  = "deleted"
	resultConflict = "conflict"
	resultError    = "error"
)

// States of trustbridge_distribution_namespaces.
const (
	stateCurrent = "current" // our ConfigMap, holding the current rendering
	statePending = "pending" // ours missing or out of date; a worker is on it
	stateForeign = "foreign" // blocked by a same-named ConfigMap we do not own
)

type metrics struct {
	writes       *prometheus.CounterVec
	foreign      prometheus.Counter
	renderErrors prometheus.Counter
	throttled    prometheus.Counter
	skipped      *prometheus.CounterVec
	lastSync     prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, c *Controller) (*metrics, error) {
	// The ConfigMap and the Secret controllers share the names, told
	// apart by kind.
	reg = prometheus.WrapRegistererWith(prometheus.Labels{"kind": strings.ToLower(string(c.cfg.Kind))}, reg)
	m := &metrics{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_distribution_writes_total",
			Help: "Writes of the trust ConfigMap or Secret (kind) by result (created, updated, deleted, conflict, error).",
		}, []string{"result"}),
		foreign: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_distribution_foreign_configmaps_total",
			Help: "Reconciles that found a same-named ConfigMap or Secret (kind) not managed by trustbridge and left it alone.",
		}),
		renderErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_distribution_render_errors_total",
			Help: "Trust store snapshots that could not be rendered; the last good content stays distributed.",
		}),
		throttled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_distribution_throttled_total",
			Help: "Writes of a namespace's trust ConfigMap or Secret (kind) postponed because it was written too often: another writer may be undoing them.",
		}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_distribution_skipped_total",
			Help: "Renderings that left a federated trust domain out (wholly, or only its .pem key), by reason.",
		}, []string{"trust_domain", "reason"}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustbridge_distribution_last_sync_timestamp_seconds",
			Help: "When a namespace was last found or brought in its desired state.",
		}),
	}
	for _, col := range []prometheus.Collector{m.writes, m.foreign, m.renderErrors, m.throttled, m.skipped, m.lastSync, &stateCollector{c: c}} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{resultCreated, resultUpdated, resultDeleted, resultConflict, resultError} {
		m.writes.WithLabelValues(r)
	}
	return m, nil
}

var descNamespaces = prometheus.NewDesc("trustbridge_distribution_namespaces",
	"Selected namespaces by the state of their trust ConfigMap or Secret (kind: current, pending, foreign), from the informer caches.",
	[]string{"state"}, nil)

// stateCollector counts namespaces at scrape time from the caches, so the
// gauge cannot drift from what the controller sees.
type stateCollector struct{ c *Controller }

func (s *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descNamespaces }

func (s *stateCollector) Collect(ch chan<- prometheus.Metric) {
	rs := s.c.run.Load()
	if rs == nil || !rs.synced.Load() {
		return
	}
	counts := map[string]int{stateCurrent: 0, statePending: 0, stateForeign: 0}
	cur := rs.content.Load()
	namespaces, _ := rs.nsLister.List(labels.Everything())
	for _, ns := range namespaces {
		if ns.DeletionTimestamp != nil || !s.c.cfg.NamespaceSelector.Matches(labels.Set(ns.Labels)) {
			continue
		}
		counts[namespaceState(rs, ns, s.c, cur)]++
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(descNamespaces, prometheus.GaugeValue, float64(n), state)
	}
}

func namespaceState(rs *runState, ns *corev1.Namespace, c *Controller, cur *content) string {
	o, err := c.cached(rs, ns.Name)
	switch {
	case err != nil || o == nil:
		return statePending
	case !owned(o):
		return stateForeign
	case cur == nil || !c.upToDate(o, cur):
		return statePending
	default:
		return stateCurrent
	}
}
