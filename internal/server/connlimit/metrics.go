package connlimit

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// listenerMetrics are one listener's series of the shared metrics.
type listenerMetrics struct {
	open           prometheus.Gauge
	expired        prometheus.Counter
	streamsRefused prometheus.Counter
	evicted        prometheus.Counter
	// refused by reason
	refused map[string]prometheus.Counter
}

// newListenerMetrics registers the metrics on reg, or finds them there
// when another listener of the process registered them first, and returns
// name's series, each present from the start at zero.
func newListenerMetrics(reg prometheus.Registerer, name string) (listenerMetrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	refused, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustbridge_listener_connections_refused_total",
		Help: "Connections a TCP listener closed at accept because their source (an IPv4 address or an IPv6 /64) held its limit of connections (reason source_limit) or of connections awaiting a confirming call (unconfirmed_source_limit: on the certificate service, half of --grpc-max-conns-per-source), or the listener held its total (total_limit); see --grpc-max-conns and its siblings.",
	}, []string{"listener", "reason"}))
	if err != nil {
		return listenerMetrics{}, err
	}
	open, err := register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "trustbridge_listener_connections_open",
		Help: "Connections a TCP listener holds: accepted within its limits and not yet closed.",
	}, []string{"listener"}))
	if err != nil {
		return listenerMetrics{}, err
	}
	expired, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustbridge_listener_connections_unconfirmed_closed_total",
		Help: "Connections closed because no call confirmed them in time: on the certificate service's listener, no successful call within --grpc-first-call-timeout of the accept.",
	}, []string{"listener"}))
	if err != nil {
		return listenerMetrics{}, err
	}
	streams, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustbridge_listener_streams_refused_total",
		Help: "Calls (HTTP/2 streams) refused on a connection not yet confirmed because it already had its limit of calls open: on the certificate service's listener, a connection that has made no successful call may have 4 calls open at once.",
	}, []string{"listener"}))
	if err != nil {
		return listenerMetrics{}, err
	}
	evicted, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustbridge_listener_connections_evicted_total",
		Help: "Connections not yet confirmed that a TCP listener closed to admit a new one, because it held its limit of connections awaiting a confirming call or its total: on the certificate service's listener, the oldest of the source holding the most of those awaiting their first successful call (a quarter of --grpc-max-conns may).",
	}, []string{"listener"}))
	if err != nil {
		return listenerMetrics{}, err
	}
	m := listenerMetrics{open: open.WithLabelValues(name), expired: expired.WithLabelValues(name), streamsRefused: streams.WithLabelValues(name),
		evicted: evicted.WithLabelValues(name), refused: map[string]prometheus.Counter{}}
	for _, r := range []string{ReasonSourceLimit, ReasonTotalLimit, ReasonUnconfirmedSourceLimit} {
		m.refused[r] = refused.WithLabelValues(name, r)
	}
	return m, nil
}

// register registers c, or returns the equal collector registered before.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("connlimit: %w", err)
}
