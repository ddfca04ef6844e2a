package workload

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	streams   *prometheus.GaugeVec
	requests  *prometheus.CounterVec
	pushes    *prometheus.CounterVec
	encodings prometheus.Counter
	refusals  *prometheus.CounterVec
	stale     prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustbridge_workload_api_streams",
			Help: "Open SPIFFE Workload API streams, by method (FetchX509SVID, FetchX509Bundles, FetchJWTBundles).",
		}, []string{"method"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_workload_api_requests_total",
			Help: "SPIFFE Workload API calls, by method and gRPC status code; a stream counts when it ends.",
		}, []string{"method", "code"}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_workload_api_pushes_total",
			Help: "Messages sent on SPIFFE Workload API streams, by method: the first one and one per change of what the stream carries.",
		}, []string{"method"}),
		encodings: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_workload_api_encodings_total",
			Help: "States encoded into Workload API responses; each encoding is shared by every stream that sends it.",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_workload_api_selection_refusals_total",
			Help: "SPIFFE Workload API calls and streams refused because the selector gave their caller no identity, when they open or when a stream selects again, by method and gRPC status code (PermissionDenied: not attested or no identity; Unavailable: attestation cannot decide yet; Internal: a selector fault). Only with a per-caller selector.",
		}, []string{"method", "code"}),
		stale: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustbridge_workload_api_stale",
			Help: "1 while the Workload API serves the last good identity and bundles because their upstream is unreachable, else 0.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.streams, m.requests, m.pushes, m.encodings, m.refusals, m.stale} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	return m, nil
}
