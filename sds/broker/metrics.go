package broker

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests *prometheus.CounterVec
	streams  *prometheus.GaugeVec
	pushes   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_broker_requests_total",
			Help: "Broker calls by API (spiffe_broker, spire_delegated_identity), method and gRPC status code; a stream counts when it ends (OK when the broker closed it).",
		}, []string{"api", "method", "code"}),
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustbridge_broker_streams",
			Help: "Open broker streams, by API and method: one per workload a broker subscribed for.",
		}, []string{"api", "method"}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_broker_pushes_total",
			Help: "Messages sent on broker streams, by API and method: the first one and one per change of what the stream carries.",
		}, []string{"api", "method"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.streams, m.pushes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	return m, nil
}
