package crd

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/trustbridge/trustbridge/internal/kubeloop"
)

type metrics struct {
	resources    *prometheus.GaugeVec
	statusWrites prometheus.Counter
	syncErrors   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m, err := kubeloop.NewMetrics(reg, kubeloop.MetricsOpts{
		Prefix:           "trustbridge_crd",
		ResourcesHelp:    "ClusterFederatedTrustDomain resources this server acts on, by outcome (applied, invalid, invalid_last_valid_applied, conflict).",
		StatusWritesHelp: "Status updates written to ClusterFederatedTrustDomain resources.",
		SyncErrorsHelp:   "ClusterFederatedTrustDomain syncs that failed (applying the endpoints or writing a status) and were retried.",
	})
	if err != nil {
		return nil, err
	}
	return &metrics{resources: m.Resources, statusWrites: m.StatusWrites, syncErrors: m.SyncErrors}, nil
}
