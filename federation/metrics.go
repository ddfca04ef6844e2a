package federation

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type pollerMetrics struct {
	fetches *prometheus.CounterVec
}

// newPollerMetrics registers the poller's metrics. Gauges that derive from
// the held bundles (age, earliest expiry, sequence) are computed at scrape
// time from Status, so they can never disagree with /v1/federation.
func newPollerMetrics(reg prometheus.Registerer, p *Poller) (*pollerMetrics, error) {
	m := &pollerMetrics{
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_federation_fetches_total",
			Help: "Bundle polls by trust domain and result (ok, or the kind of failure or refusal).",
		}, []string{"trust_domain", "result"}),
	}
	if err := reg.Register(m.fetches); err != nil {
		return nil, err
	}
	if err := reg.Register(&statusCollector{p: p}); err != nil {
		return nil, err
	}
	return m, nil
}

var (
	descAge = prometheus.NewDesc("trustbridge_federation_bundle_age_seconds",
		"Seconds since the trust domain's bundle was last fetched successfully.", []string{"trust_domain"}, nil)
	descExpiry = prometheus.NewDesc("trustbridge_federation_earliest_authority_expiry_timestamp_seconds",
		"Expiry of the trust domain's X.509 authority that expires first.", []string{"trust_domain"}, nil)
	descSequence = prometheus.NewDesc("trustbridge_federation_bundle_sequence",
		"spiffe_sequence of the trust domain's held bundle.", []string{"trust_domain"}, nil)
	descFailures = prometheus.NewDesc("trustbridge_federation_consecutive_failures",
		"Failed polls since the last success.", []string{"trust_domain"}, nil)
	descState = prometheus.NewDesc("trustbridge_federation_state",
		"1 for the trust domain's current state (ok, failing, stale, pending).", []string{"trust_domain", "state"}, nil)
)

type statusCollector struct{ p *Poller }

func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descAge, descExpiry, descSequence, descFailures, descState} {
		ch <- d
	}
}

func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.p.cfg.Now()
	for _, s := range c.p.Status() {
		if s.LastSuccess != nil {
			ch <- prometheus.MustNewConstMetric(descAge, prometheus.GaugeValue, now.Sub(*s.LastSuccess).Seconds(), s.TrustDomain)
		}
		var earliest time.Time
		for _, a := range s.Authorities {
			if a.NotAfter != nil && (earliest.IsZero() || a.NotAfter.Before(earliest)) {
				earliest = *a.NotAfter
			}
		}
		if !earliest.IsZero() {
			ch <- prometheus.MustNewConstMetric(descExpiry, prometheus.GaugeValue, float64(earliest.Unix()), s.TrustDomain)
		}
		if s.Sequence != nil {
			ch <- prometheus.MustNewConstMetric(descSequence, prometheus.GaugeValue, float64(*s.Sequence), s.TrustDomain)
		}
		ch <- prometheus.MustNewConstMetric(descFailures, prometheus.GaugeValue, float64(s.ConsecutiveFailures), s.TrustDomain)
		ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, 1, s.TrustDomain, string(s.State))
	}
}
