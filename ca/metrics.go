package ca

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/trustbridge/trustbridge/ca/castate"
)

type metrics struct {
	rootNotAfter    *prometheus.GaugeVec
	sequence        prometheus.Gauge
	signings        *prometheus.CounterVec
	signingTime     prometheus.Histogram
	rotations       *prometheus.CounterVec
	reconcileErrors prometheus.Counter
	jwtKeys         *prometheus.GaugeVec
	jwtNotAfter     *prometheus.GaugeVec
	jwtSignings     *prometheus.CounterVec
	jwtEvents       *prometheus.CounterVec

	upstreamRequests    *prometheus.CounterVec
	upstreamLastSuccess prometheus.Gauge
	intermediateExpiry  prometheus.Gauge
	lastSuccess         float64 // the gauge's value, under the Authority's mu
	// keyManagerErrors counts failed calls to Config.Keys, by operation.
	keyManagerErrors *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, notReady func() float64) (*metrics, error) {
	m := &metrics{
		rootNotAfter: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustbridge_ca_root_not_after_timestamp_seconds",
			Help: "Expiry of each CA root, by root id and state (prepared, active, retired).",
		}, []string{"root_id", "state"}),
		sequence: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustbridge_ca_bundle_sequence",
			Help: "spiffe_sequence of the local trust domain's published bundle.",
		}),
		signingTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "trustbridge_ca_signing_duration_seconds",
			Help: "Time the CA took to sign one certificate (workload CSRs from every caller: the certificate service, SDS, ca issue, and serving certificates), waiting for its lock included.",
			// Wall time, not CPU: an RSA-4096 root signs in milliseconds;
			// seconds mean the lock was held by a rotation or a slow store.
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		signings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_ca_signings_total",
			Help: "Workload certificate signing requests, by result.",
		}, []string{"result"}),
		rotations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_ca_rotation_events_total",
			Help: "Root lifecycle events: bootstrap, prepared, activated, retired, removed, plugin_change.",
		}, []string{"event"}),
		reconcileErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_ca_rotation_errors_total",
			Help: "Scheduled rotation checks that failed; the current roots were kept.",
		}),
	}
	m.addJWT()
	m.addUpstream()
	m.keyManagerErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustbridge_ca_key_manager_errors_total",
		Help: "Failed calls to the key manager (--key-manager), by operation: create (a new root or JWT key; the previous state was kept), find (a key the state names), destroy (a key no longer used; tried again after the next change).",
	}, []string{"operation"})
	for _, op := range []string{"create", "find", "destroy"} {
		m.keyManagerErrors.WithLabelValues(op)
	}
	notReadyGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "trustbridge_ca_not_ready",
		Help: "1 while the CA reports a problem on /readyz (invalid --ca-dir change, failed rotation check, expired root), else 0.",
	}, notReady)
	for _, c := range []prometheus.Collector{m.rootNotAfter, m.sequence, m.signings, m.signingTime, m.rotations, m.reconcileErrors, notReadyGauge,
		m.jwtKeys, m.jwtNotAfter, m.jwtSignings, m.jwtEvents, m.upstreamRequests, m.upstreamLastSuccess, m.intermediateExpiry, m.keyManagerErrors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) addJWT() {
	m.jwtKeys = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "trustbridge_ca_jwt_keys",
		Help: "JWT-SVID signing keys published in the bundle, by state (prepared, active, retired); active 0 means the CA cannot mint JWT-SVIDs.",
	}, []string{"state"})
	m.jwtNotAfter = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "trustbridge_ca_jwt_key_not_after_timestamp_seconds",
		Help: "End of life of each JWT-SVID signing key, by kid and state; no JWT-SVID it signs outlives it.",
	}, []string{"kid", "state"})
	m.jwtSignings = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustbridge_ca_jwt_svids_signed_total",
		Help: "JWT-SVID signing requests, by result (ok, invalid_claims, invalid_ttl, identity_not_allowed, signing_material, error).",
	}, []string{"result"})
	m.jwtEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustbridge_ca_jwt_key_events_total",
		Help: "JWT signing key lifecycle events: bootstrap, prepared, activated, retired, removed.",
	}, []string{"event"})
}

func (m *metrics) observe(roots []*castate.Root, jwtKeys []*castate.JWTKey, sequence uint64) {
	m.rootNotAfter.Reset()
	m.intermediateExpiry.Set(0)
	for _, r := range roots {
		m.rootNotAfter.WithLabelValues(r.ID, string(r.State)).Set(float64(r.Cert.NotAfter.Unix()))
		m.observeIntermediate(r)
	}
	m.sequence.Set(float64(sequence))
	m.jwtNotAfter.Reset()
	count := map[castate.RootState]int{castate.StatePrepared: 0, castate.StateActive: 0, castate.StateRetired: 0}
	for _, k := range jwtKeys {
		count[k.State]++
		m.jwtNotAfter.WithLabelValues(k.KID, string(k.State)).Set(float64(k.NotAfter.Unix()))
	}
	for state, n := range count {
		m.jwtKeys.WithLabelValues(string(state)).Set(float64(n))
	}
}

func (m *metrics) addUpstream() {
	m.upstreamRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustbridge_ca_upstream_requests_total",
		Help: "Requests to the upstream authority for an intermediate, by result (ok; error: unreachable or failed, asked again from 5s; refused: the upstream said no or its answer failed our checks, asked again every 5m).",
	}, []string{"result"})
	m.upstreamLastSuccess = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "trustbridge_ca_upstream_last_success_timestamp_seconds",
		Help: "When the upstream authority last signed an intermediate for this CA; 0 outside upstream mode.",
	})
	m.intermediateExpiry = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "trustbridge_ca_intermediate_expiry_timestamp_seconds",
		Help: "Expiry of the active intermediate the upstream authority signed (no leaf outlives it); 0 outside upstream mode or without one.",
	})
}

// observeIntermediate records an upstream-signed intermediate's expiry
// (the active one) and when the upstream signed it, so followers, which
// never ask the upstream, report both too.
func (m *metrics) observeIntermediate(r *castate.Root) {
	if r.Upstream == nil {
		return
	}
	if r.State == castate.StateActive {
		m.intermediateExpiry.Set(float64(r.Cert.NotAfter.Unix()))
	}
	m.setUpstreamSuccess(r.Upstream.ObtainedAt)
}

// setUpstreamSuccess moves the last-success gauge up to at; call it under
// the Authority's mu.
func (m *metrics) setUpstreamSuccess(at time.Time) {
	if v := float64(at.Unix()); v > m.lastSuccess {
		m.lastSuccess = v
		m.upstreamLastSuccess.Set(v)
	}
}
