package mapcrd

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/trustbridge/trustbridge/internal/kube/crdcontroller"
)

func newMetrics() *crdcontroller.Metrics {
	return &crdcontroller.Metrics{
		Resources: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustbridge_identity_map_crd_resources",
			Help: "ClusterIdentityMapping resources, by outcome (accepted, invalid, invalid_last_valid_applied, refused).",
		}, []string{"state"}),
		StatusWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_identity_map_crd_status_writes_total",
			Help: "Status updates written to ClusterIdentityMapping resources.",
		}),
		SyncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_identity_map_crd_sync_errors_total",
			Help: "ClusterIdentityMapping syncs that failed (the identity map refused the rules, or a status write failed) and were retried.",
		}),
	}
}
