package trustpolicy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/trustbridge/trustbridge/internal/fileutil/rulesource"
)

// newMetrics defines the trust policy's reload metrics and registers them
// on reg.
func newMetrics(reg prometheus.Registerer) (*rulesource.Metrics, error) {
	m := &rulesource.Metrics{
		Reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_trust_policy_reloads_total",
			Help: "Trust policy loads by source (file:<path>, config:<path>, crd) and result (success, error); on error the source keeps its last good rules.",
		}, []string{"source", "result"}),
		Rules: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustbridge_trust_policy_rules",
			Help: "Trust policy rules in force, by source.",
		}, []string{"source"}),
		LastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustbridge_trust_policy_last_reload_success_timestamp_seconds",
			Help: "When each trust policy source last loaded successfully (unix seconds); alert when a source's reloads fail and this stops moving.",
		}, []string{"source"}),
	}
	if err := m.Register(reg); err != nil {
		return nil, err
	}
	return m, nil
}
