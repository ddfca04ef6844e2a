package identitymap

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/trustbridge/trustbridge/internal/fileutil/rulesource"
)

// metrics are the sources' reload metrics and the map's conflicts; a nil
// *metrics records nothing.
type metrics struct {
	*rulesource.Metrics
	conflicts prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		Metrics: &rulesource.Metrics{
			Reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "trustbridge_identity_map_reloads_total",
				Help: "Identity map loads by source (file:<path>, crd) and result (success, error); on error the source keeps its last good rules.",
			}, []string{"source", "result"}),
			Rules: prometheus.NewGaugeVec(prometheus.GaugeOpts{
				Name: "trustbridge_identity_map_rules",
				Help: "Identity map rules in force, by source.",
			}, []string{"source"}),
			LastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
				Name: "trustbridge_identity_map_last_reload_success_timestamp_seconds",
				Help: "When each identity map source last loaded successfully (unix seconds); alert when a source's reloads fail and this stops moving.",
			}, []string{"source"}),
		},
		conflicts: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustbridge_identity_map_conflicts",
			Help: "Pairs of identity map rules in force that may select one workload with different SPIFFE ID templates (at most 1000); such a workload gets no identity.",
		}),
	}
	if err := m.Register(reg); err != nil {
		return nil, err
	}
	if err := reg.Register(m.conflicts); err != nil {
		return nil, err
	}
	return m, nil
}

// sources are the reload metrics, nil when m is.
func (m *metrics) sources() *rulesource.Metrics {
	if m == nil {
		return nil
	}
	return m.Metrics
}

func (m *metrics) published(mp *Map) {
	if m == nil {
		return
	}
	m.conflicts.Set(float64(len(mp.conflictSet().list)))
}
