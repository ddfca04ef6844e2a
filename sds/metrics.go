package sds

import "github.com/prometheus/client_golang/prometheus"

// Values of the type label.
const (
	typeSotW  = "sotw"
	typeDelta = "delta"
	typeFetch = "fetch"
)

type metrics struct {
	streams   *prometheus.GaugeVec
	responses *prometheus.CounterVec
	nacks     *prometheus.CounterVec
	authFails prometheus.Counter
	// reauthRetries counts re-authentications that found the backend
	// unavailable and were retried with the stream kept.
	reauthRetries prometheus.Counter
	encodings     *prometheus.CounterVec
	// policyDenials counts explicit denials of a trust domain a stream
	// asked for, once per stream, resource and decision.
	policyDenials *prometheus.CounterVec
	validation    prometheus.Counter // encodings{kind="validation"}
	cert          prometheus.Counter // encodings{kind="certificate"}
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustbridge_sds_streams",
			Help: "Open SDS streams, by protocol variant (sotw, delta).",
		}, []string{"type"}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_sds_responses_total",
			Help: "SDS responses sent, by protocol variant (sotw, delta, fetch).",
		}, []string{"type"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_sds_nacks_total",
			Help: "SDS responses the client rejected (NACK), by protocol variant.",
		}, []string{"type"}),
		authFails: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_sds_authentication_failures_total",
			Help: "SDS streams and fetches refused because the caller did not authenticate (or re-authenticate at a refresh), or is not a member of the local trust domain.",
		}),
		reauthRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_sds_reauthentication_retries_total",
			Help: "Stream re-authentications that found the authentication backend unavailable and were retried with backoff, the stream kept with its current credential.",
		}),
		encodings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_sds_encodings_total",
			Help: "Secrets marshalled, by kind (validation, certificate); each is shared by every stream that sends it.",
		}, []string{"kind"}),
		policyDenials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_sds_policy_denials_total",
			Help: "Validation contexts of a trust domain (spiffe://<td>) answered with an explicit denial because the trust policy does not let the caller trust it, by the trust domain denied (trust_domain is the server's own); counted once per stream, resource and decision.",
		}, []string{"denied_trust_domain"}),
	}
	m.validation = m.encodings.WithLabelValues("validation")
	m.cert = m.encodings.WithLabelValues("certificate")
	for _, c := range []prometheus.Collector{m.streams, m.responses, m.nacks, m.authFails, m.reauthRetries, m.encodings, m.policyDenials} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
