package agent

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Values of the result label.
const (
	resultSuccess = "success"
	resultFailure = "failure"
)

// metrics are the agent's own; the SDS server and the Rotator register
// theirs.
type metrics struct {
	fileReloads     *prometheus.CounterVec
	relayResponses  *prometheus.CounterVec
	relayStreamErrs prometheus.Counter
	relayConnected  prometheus.Gauge
	// The Workload API's bundle stream (WatchBundles).
	bundleResponses  *prometheus.CounterVec
	bundleStreamErrs prometheus.Counter
	bundlesConnected prometheus.Gauge
	// taintReissues counts the certificates re-issued because a tainted
	// authority signed them, the agent's and its workloads'.
	taintReissues prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		fileReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_agent_credential_file_loads_total",
			Help: "Loads of changed credential files, by result; on failure the last good credential stays.",
		}, []string{"result"}),
		relayResponses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_agent_relay_responses_total",
			Help: "Validation-context responses from the server's SDS, by result (success: ACKed, failure: NACKed, last good trust kept).",
		}, []string{"result"}),
		relayStreamErrs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_agent_relay_stream_failures_total",
			Help: "Failed or broken SDS streams to the server; each is retried with backoff.",
		}),
		relayConnected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustbridge_agent_relay_connected",
			Help: "1 while the SDS stream to the server is open.",
		}),
		bundleResponses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_agent_bundles_responses_total",
			Help: "Bundle maps from the server's WatchBundles for the Workload API, by result (failure: did not parse, last good bundles kept).",
		}, []string{"result"}),
		bundleStreamErrs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_agent_bundles_stream_failures_total",
			Help: "Failed or broken WatchBundles streams to the server; each is retried with backoff while the Workload API serves the last good bundles.",
		}),
		bundlesConnected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustbridge_agent_bundles_connected",
			Help: "1 while the WatchBundles stream to the server delivers; 0 while the Workload API serves the last good bundles (stale) or none came yet.",
		}),
		taintReissues: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_agent_taint_reissues_total",
			Help: "X509-SVIDs re-issued because the server named the authority that signed them tainted (the agent's own and, on a node, its workloads').",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.fileReloads, m.relayResponses, m.relayStreamErrs, m.relayConnected,
		m.bundleResponses, m.bundleStreamErrs, m.bundlesConnected, m.taintReissues} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	return m, nil
}
