package crd

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	resources    *prometheus.GaugeVec
	statusWrites prometheus.Counter
	syncErrors   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		resources: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustbridge_crd_resources",
			Help: "ClusterFederatedTrustDomain resources this server acts on, by outcome (applied, invalid, invalid_last_valid_applied, conflict).",
		}, []string{"state"}),
		statusWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_crd_status_writes_total",
			Help: "Status updates written to ClusterFederatedTrustDomain resources.",
		}),
		syncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_crd_sync_errors_total",
			Help: "ClusterFederatedTrustDomain syncs that failed (applying the endpoints or writing a status) and were retried.",
		}),
	}
	for _, c := range []prometheus.Collector{m.resources, m.statusWrites, m.syncErrors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
