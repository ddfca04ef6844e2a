package certservice

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests     *prometheus.CounterVec
	signDuration prometheus.Histogram
	// The signing queue (admission.go).
	queueWaiting prometheus.Gauge
	queueWait    prometheus.Histogram
	grantChecks  *prometheus.CounterVec
	dnsNames     *prometheus.CounterVec
	// The identity service (identity.go, watch.go).
	jwtSVIDs      *prometheus.CounterVec
	intermediates *prometheus.CounterVec
	watches       *prometheus.CounterVec
	// impersonatedWatches counts, once more, the watches of node agents
	// acting for a workload.
	impersonatedWatches *prometheus.CounterVec
	watchesOpen         prometheus.Gauge
	watchMessages       prometheus.Counter
	// watchOversized counts bundle maps too large to send.
	watchOversized prometheus.Counter
}

// newQueueMetrics are the signing queue's (admission): requests waiting
// now, and how long they waited.
func newQueueMetrics() (prometheus.Gauge, prometheus.Histogram) {
	return prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustbridge_certservice_signing_queue_waiting",
			Help: "Signing requests (certificates, JWT-SVIDs, intermediates) waiting now for one of the --sign-concurrency signing slots, at most --sign-queue-size; beyond it they are refused (ResourceExhausted, reason queue_full in the log).",
		}), prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "trustbridge_certservice_signing_queue_wait_seconds",
			Help:    "Time signing requests waited for a signing slot, 0 for one that found a slot free; those that waited --sign-queue-timeout (refused: ResourceExhausted, reason queue_timeout) or whose caller left are included.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16), // 1ms .. ~33s
		})
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
		grantChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_certservice_renewal_grant_checks_total",
			Help: "Renewals by X509-SVID, by the method that first granted the chain (bootstrap-token, kubernetes-jwt, oidc, kubernetes-issuer, legacy: the certificate records none, sds-minted: never renewed; unknown) and result (accepted; revoked: the token, service account or issuer is gone; unavailable: could not check; invalid: unreadable, or the certificate was not signed by this server's CA; lifetime_exceeded: older than the maximum renewal lifetime).",
		}, []string{"grant_method", "result"}),
		dnsNames: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_certservice_workload_dns_names_total",
			Help: "Certificates of Kubernetes identities under --workload-dns-name-template, by result (added: the certificate carries the workload DNS name; skipped: issued with its SPIFFE ID only, because the namespace or service account is not one DNS label, the ID is not /ns/<namespace>/sa/<name>, or the name is reserved; the reason is logged).",
		}, []string{"result"}),
		jwtSVIDs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_certservice_jwt_svids_total",
			Help: "JWT-SVIDs asked for (a MintJWTSVID call, or one item of a MintJWTSVIDs batch; a batch refused as a whole counts each of its items, or one when it holds none or more than 64), by gRPC status code (OK: a JWT-SVID was issued) and authentication method (none when authentication failed).",
		}, []string{"code", "method"}),
		intermediates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_certservice_intermediates_total",
			Help: "SignIntermediate calls of downstream trustbridges, by gRPC status code (OK: an intermediate was signed; PermissionDenied: not in --downstream-allow or not authenticated by an X509-SVID; Unauthenticated: no valid credential, or an X509-SVID whose grant no longer stands or that this server's CA did not sign) and authentication method (none when authentication failed).",
		}, []string{"code", "method"}),
		watches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_certservice_bundle_watches_total",
			Help: "WatchBundles streams refused or ended, by gRPC status code (Canceled: the caller left; Unauthenticated: its credential expired or no longer authenticates; Unavailable: the server stopped) and authentication method.",
		}, []string{"code", "method"}),
		impersonatedWatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_certservice_impersonated_bundle_watches_total",
			Help: "WatchBundles streams of node agents asking for a workload's trust (impersonated_identity), refused or ended, by gRPC status code (PermissionDenied: the caller may not act for the workload, or no longer: the pod left its node; Unavailable: the node authorizer could not decide, or the server stopped); each is counted in trustbridge_certservice_bundle_watches_total too.",
		}, []string{"code"}),
		watchesOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustbridge_certservice_bundle_watches_open",
			Help: "WatchBundles streams open now.",
		}),
		watchMessages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_certservice_bundle_watch_messages_total",
			Help: "Bundle maps sent on WatchBundles streams: one when a stream opens, one per change of what its caller may trust.",
		}),
		watchOversized: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_certservice_bundle_watch_oversized_total",
			Help: "Bundle maps over the 16 MiB a WatchBundles message may carry, not sent: the stream ends with ResourceExhausted and the agent keeps its last bundles. Grant that caller fewer trust domains.",
		}),
	}
	m.queueWaiting, m.queueWait = newQueueMetrics()
	for _, c := range []prometheus.Collector{m.requests, m.signDuration, m.queueWaiting, m.queueWait, m.grantChecks, m.dnsNames, m.jwtSVIDs, m.intermediates, m.watches, m.impersonatedWatches, m.watchesOpen, m.watchMessages, m.watchOversized} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
