package crdcontroller

import "github.com/prometheus/client_golang/prometheus"

// Metrics are a controller's three metrics. Each controller declares its
// own (names and help of its resource), written out where docs/metrics.md's
// generator reads them, and registers them with Register.
type Metrics struct {
	// Resources counts the resources by outcome, in label "state".
	Resources *prometheus.GaugeVec
	// StatusWrites counts the status updates written.
	StatusWrites prometheus.Counter
	// SyncErrors counts the syncs that failed and were retried
	// (Config.SyncErrors).
	SyncErrors prometheus.Counter
}

// Register registers m with reg; nil registers nowhere.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{m.Resources, m.StatusWrites, m.SyncErrors} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// SetStates sets Resources to the count of each state.
func (m *Metrics) SetStates(states []string) {
	m.Resources.Reset()
	for _, s := range states {
		m.Resources.WithLabelValues(s).Inc()
	}
}
