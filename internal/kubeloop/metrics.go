package kubeloop

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the three series each controller exports, under its own
// names: resources by outcome, status writes and failed syncs.
type Metrics struct {
	Resources    *prometheus.GaugeVec // label "state"
	StatusWrites prometheus.Counter
	SyncErrors   prometheus.Counter
}

// MetricsOpts names the series: Prefix+"_resources",
// Prefix+"_status_writes_total" and Prefix+"_sync_errors_total", each with
// its help text.
type MetricsOpts struct {
	Prefix                                          string
	ResourcesHelp, StatusWritesHelp, SyncErrorsHelp string
}

// NewMetrics creates the series and registers them on reg.
func NewMetrics(reg prometheus.Registerer, o MetricsOpts) (*Metrics, error) {
	m := &Metrics{
		Resources: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: o.Prefix + "_resources", Help: o.ResourcesHelp,
		}, []string{"state"}),
		StatusWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: o.Prefix + "_status_writes_total", Help: o.StatusWritesHelp,
		}),
		SyncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: o.Prefix + "_sync_errors_total", Help: o.SyncErrorsHelp,
		}),
	}
	for _, c := range []prometheus.Collector{m.Resources, m.StatusWrites, m.SyncErrors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
