package crd

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/trustbridge/trustbridge/internal/kube/crdcontroller"
)

func newMetrics(reg prometheus.Registerer) (*crdcontroller.Metrics, error) {
	m := &crdcontroller.Metrics{
		Resources: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustbridge_crd_resources",
			Help: "ClusterFederatedTrustDomain resources this server acts on, by outcome (applied, invalid, invalid_last_valid_applied, conflict).",
		}, []string{"state"}),
		StatusWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_crd_status_writes_total",
			Help: "Status updates written to ClusterFederatedTrustDomain resources.",
		}),
		SyncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_crd_sync_errors_total",
			Help: "ClusterFederatedTrustDomain syncs that failed (applying the endpoints or writing a status) and were retried.",
		}),
	}
	if err := m.Register(reg); err != nil {
		return nil, err
	}
	return m, nil
}
