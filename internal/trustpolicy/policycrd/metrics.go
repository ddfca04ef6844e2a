package policycrd

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
		Prefix:           "trustbridge_trust_policy_crd",
		ResourcesHelp:    "ClusterTrustPolicy resources, by outcome (applied, invalid, invalid_last_valid_applied, conflict).",
		StatusWritesHelp: "Status updates written to ClusterTrustPolicy resources.",
		SyncErrorsHelp:   "ClusterTrustPolicy syncs that failed (the policy refused the rules, or a status write failed) and were retried.",
	})
	if err != nil {
		return nil, err
	}
	return &metrics{resources: m.Resources, statusWrites: m.StatusWrites, syncErrors: m.SyncErrors}, nil
}
