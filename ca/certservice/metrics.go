package certservice

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests     *prometheus.CounterVec
	signDuration prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_certservice_requests_total",
			Help: "CreateCertificate calls, by gRPC status code and authentication method (none when authentication failed).",
		}, []string{"code", "method"}),
		signDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "trustbridge_certservice_signing_duration_seconds",
			Help:    "Time the CA took to sign one certificate, refusals included.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14), // 100µs .. ~0.8s
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.signDuration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
