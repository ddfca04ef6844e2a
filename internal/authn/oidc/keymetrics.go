package oidc

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// keyMetrics are the key sets' metrics, labelled by issuer name; shared
// by every issuer of an authenticator.
type keyMetrics struct {
	fetches     *prometheus.CounterVec
	keys        *prometheus.GaugeVec
	lastSuccess *prometheus.GaugeVec
}

// newKeyMetrics registers the key set metrics on reg (none when nil).
func newKeyMetrics(reg prometheus.Registerer) (*keyMetrics, error) {
	m := &keyMetrics{
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_authn_oidc_key_fetches_total",
			Help: "Fetches of an OIDC issuer's keys (discovery document and JWKS), by result (ok, error).",
		}, []string{"issuer", "result"}),
		keys: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustbridge_authn_oidc_keys",
			Help: "Usable signing keys held for an OIDC issuer; 0 means its tokens are refused.",
		}, []string{"issuer"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustbridge_authn_oidc_keys_last_success_timestamp_seconds",
			Help: "Unix time at which the last successful fetch of an OIDC issuer's keys started; 0 before the first.",
		}, []string{"issuer"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.fetches, m.keys, m.lastSuccess} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register OIDC issuer key metrics: %w", err)
		}
	}
	return m, nil
}

// init creates issuer's series at zero, so that alerts on them work
// before the first fetch.
func (m *keyMetrics) init(issuer string) {
	if m == nil {
		return
	}
	m.fetches.WithLabelValues(issuer, "ok")
	m.fetches.WithLabelValues(issuer, "error")
	m.keys.WithLabelValues(issuer).Set(0)
	m.lastSuccess.WithLabelValues(issuer).Set(0)
}

// fetched counts a fetch and sets the keys held after it.
func (m *keyMetrics) fetched(issuer string, err error, keys int, lastSuccess time.Time) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.fetches.WithLabelValues(issuer, result).Inc()
	m.keys.WithLabelValues(issuer).Set(float64(keys))
	if !lastSuccess.IsZero() {
		m.lastSuccess.WithLabelValues(issuer).Set(float64(lastSuccess.UnixNano()) / 1e9)
	}
}

// held sets the keys held, when they change without a fetch (expiry).
func (m *keyMetrics) held(issuer string, keys int) {
	if m == nil {
		return
	}
	m.keys.WithLabelValues(issuer).Set(float64(keys))
}
