package identitymap

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Results of trustbridge_identity_map_reloads_total.
const (
	resultSuccess = "success"
	resultError   = "error"
)

// metrics are per source; a nil *metrics records nothing.
type metrics struct {
	reloads     *prometheus.CounterVec
	rules       *prometheus.GaugeVec
	lastSuccess *prometheus.GaugeVec
	conflicts   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_identity_map_reloads_total",
			Help: "Identity map loads by source (file:<path>, crd) and result (success, error); on error the source keeps its last good rules.",
		}, []string{"source", "result"}),
		rules: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustbridge_identity_map_rules",
			Help: "Identity map rules in force, by source.",
		}, []string{"source"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustbridge_identity_map_last_reload_success_timestamp_seconds",
			Help: "When each identity map source last loaded successfully (unix seconds); alert when a source's reloads fail and this stops moving.",
		}, []string{"source"}),
		conflicts: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustbridge_identity_map_conflicts",
			Help: "Pairs of identity map rules in force that may select one workload with different SPIFFE ID templates (at most 1000); such a workload gets no identity.",
		}),
	}
	for _, c := range []prometheus.Collector{m.reloads, m.rules, m.lastSuccess, m.conflicts} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) reloaded(st Status, ok bool) {
	if m == nil {
		return
	}
	for _, r := range []string{resultSuccess, resultError} {
		m.reloads.WithLabelValues(st.Source, r) // both series exist from the first load
	}
	if !ok {
		m.reloads.WithLabelValues(st.Source, resultError).Inc()
		return
	}
	m.reloads.WithLabelValues(st.Source, resultSuccess).Inc()
	m.rules.WithLabelValues(st.Source).Set(float64(st.Rules))
	m.lastSuccess.WithLabelValues(st.Source).Set(float64(st.LastSuccess))
}

func (m *metrics) published(mp *Map) {
	if m == nil {
		return
	}
	m.conflicts.Set(float64(len(mp.conflictSet().list)))
}

func (m *metrics) remove(source string) {
	if m == nil {
		return
	}
	m.reloads.DeletePartialMatch(prometheus.Labels{"source": source})
	m.rules.DeleteLabelValues(source)
	m.lastSuccess.DeleteLabelValues(source)
}
