package bundleserver

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Route labels of trustbridge_bundleserver_requests_total.
const (
	routeLocal = iota
	routeByName
	routeMap
	routeNone
	routeDiscovery
	routeJWKS
	numRoutes
)

var routeNames = [numRoutes]string{"local", "bundles", "bundle_map", "none", "oidc_discovery", "oidc_jwks"}

// statusCodes are the only codes the handlers write; their counters are
// resolved once so that a request costs one atomic add.
var statusCodes = []int{http.StatusOK, http.StatusNotModified, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusServiceUnavailable}

type metrics struct {
	requests     *prometheus.CounterVec
	byCode       [numRoutes]map[int]prometheus.Counter
	sequence     *prometheus.GaugeVec
	updateErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_bundleserver_requests_total",
			Help: "Bundle endpoint requests, by route (local, bundles, bundle_map, none, oidc_discovery, oidc_jwks) and status code.",
		}, []string{"route", "code"}),
		sequence: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustbridge_bundleserver_served_sequence",
			Help: "spiffe_sequence of the bundle being served, by trust domain.",
		}, []string{"trust_domain"}),
		updateErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_bundleserver_update_errors_total",
			Help: "Bundles refused by Update (wrong trust domain, no keys, not serializable, duplicate), each counted once; the last good document stays served.",
		}),
	}
	for r := range numRoutes {
		m.byCode[r] = make(map[int]prometheus.Counter, len(statusCodes))
		for _, code := range statusCodes {
			m.byCode[r][code] = m.requests.WithLabelValues(routeNames[r], strconv.Itoa(code))
		}
	}
	for _, c := range []prometheus.Collector{m.requests, m.sequence, m.updateErrors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) served(route, code int) {
	if c, ok := m.byCode[route][code]; ok {
		c.Inc()
		return
	}
	m.requests.WithLabelValues(routeNames[route], strconv.Itoa(code)).Inc()
}
