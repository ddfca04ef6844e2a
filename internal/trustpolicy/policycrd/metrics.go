package policycrd

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/trustbridge/trustbridge/internal/kube/crdcontroller"
)

func newMetrics() *crdcontroller.Metrics {
	return &crdcontroller.Metrics{
		Resources: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustbridge_trust_policy_crd_resources",
			Help: "ClusterTrustPolicy resources, by outcome (applied, invalid, invalid_last_valid_applied, conflict).",
		}, []string{"state"}),
		StatusWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_trust_policy_crd_status_writes_total",
			Help: "Status updates written to ClusterTrustPolicy resources.",
		}),
		SyncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_trust_policy_crd_sync_errors_total",
			Help: "ClusterTrustPolicy syncs that failed (the policy refused the rules, or a status write failed) and were retried.",
		}),
	}
}
