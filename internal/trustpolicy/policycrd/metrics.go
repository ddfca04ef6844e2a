package policycrd

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	resources    *prometheus.GaugeVec
	statusWrites prometheus.Counter
	syncErrors   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		resources: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustbridge_trust_policy_crd_resources",
			Help: "ClusterTrustPolicy resources, by outcome (applied, invalid, invalid_last_valid_applied, conflict).",
		}, []string{"state"}),
		statusWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_trust_policy_crd_status_writes_total",
			Help: "Status updates written to ClusterTrustPolicy resources.",
		}),
		syncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_trust_policy_crd_sync_errors_total",
			Help: "ClusterTrustPolicy syncs that failed (the policy refused the rules, or a status write failed) and were retried.",
		}),
	}
	for _, c := range []prometheus.Collector{m.resources, m.statusWrites, m.syncErrors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
