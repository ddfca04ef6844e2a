package rulesource

import "github.com/prometheus/client_golang/prometheus"

// Results, the result label of Metrics.Reloads.
const (
	ResultSuccess = "success"
	ResultError   = "error"
)

// Metrics are the reload metrics of every source. Each user defines and
// registers its own (its metric names, its help texts, and so its
// documentation); a nil *Metrics records nothing.
type Metrics struct {
	// Reloads counts loads by source and result (ResultSuccess,
	// ResultError).
	Reloads *prometheus.CounterVec
	// Rules is the number of rules in force, by source.
	Rules *prometheus.GaugeVec
	// LastSuccess is when each source last loaded (unix seconds).
	LastSuccess *prometheus.GaugeVec
}

// Register registers the three metrics on reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.Reloads, m.Rules, m.LastSuccess} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *Metrics) reloaded(st Status, ok bool) {
	if m == nil {
		return
	}
	for _, r := range []string{ResultSuccess, ResultError} {
		m.Reloads.WithLabelValues(st.Source, r) // both series exist from the first load
	}
	if !ok {
		m.Reloads.WithLabelValues(st.Source, ResultError).Inc()
		return
	}
	m.Reloads.WithLabelValues(st.Source, ResultSuccess).Inc()
	m.Rules.WithLabelValues(st.Source).Set(float64(st.Rules))
	m.LastSuccess.WithLabelValues(st.Source).Set(float64(st.LastSuccess))
}

func (m *Metrics) remove(source string) {
	if m == nil {
		return
	}
	m.Reloads.DeletePartialMatch(prometheus.Labels{"source": source})
	m.Rules.DeleteLabelValues(source)
	m.LastSuccess.DeleteLabelValues(source)
}
