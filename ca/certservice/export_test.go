package certservice

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/trustbridge/trustbridge/internal/loop"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
)

// GrantChecksForTest is one series of
// trustbridge_certservice_renewal_grant_checks_total.
func (s *Service) GrantChecksForTest(method, result string) prometheus.Counter {
	return s.metrics.grantChecks.WithLabelValues(method, result)
}

// JWTSVIDsForTest is one series of trustbridge_certservice_jwt_svids_total.
func (s *Service) JWTSVIDsForTest(code, method string) prometheus.Counter {
	return s.metrics.jwtSVIDs.WithLabelValues(code, method)
}

// WatchesForTest is one series of trustbridge_certservice_bundle_watches_total.
func (s *Service) WatchesForTest(code, method string) prometheus.Counter {
	return s.metrics.watches.WithLabelValues(code, method)
}

// WatchesOpenForTest is trustbridge_certservice_bundle_watches_open.
func (s *Service) WatchesOpenForTest() prometheus.Gauge { return s.metrics.watchesOpen }

// WatchMessagesForTest is trustbridge_certservice_bundle_watch_messages_total.
func (s *Service) WatchMessagesForTest() prometheus.Counter { return s.metrics.watchMessages }

// WatchOversizedForTest is trustbridge_certservice_bundle_watch_oversized_total.
func (s *Service) WatchOversizedForTest() prometheus.Counter { return s.metrics.watchOversized }

// SetMaxWatchMessageForTest lowers the largest WatchBundles message sent.
func (s *Service) SetMaxWatchMessageForTest(n int64) { s.maxWatchMessage.Store(n) }

// SetRandForTest fixes the jitter of re-authentication.
func (s *Service) SetRandForTest(f func() float64) { s.rand.Store(&f) }

// Jittered is the re-authentication jitter applied to d.
func Jittered(d time.Duration, r float64) time.Duration {
	return loop.Jitter(d, reauthJitter, r)
}

// SetFaultLogForTest replaces the limiter of lasting faults' Error lines.
func (s *Service) SetFaultLogForTest(l *ratelimit.LogLimiter) { s.faultLog.Store(l) }

// WorkloadDNSNamesForTest is one series of
// trustbridge_certservice_workload_dns_names_total.
func (s *Service) WorkloadDNSNamesForTest(result string) prometheus.Counter {
	return s.metrics.dnsNames.WithLabelValues(result)
}

// IntermediatesForTest is the SignIntermediate counter of code and method.
func (s *Service) IntermediatesForTest(code, method string) prometheus.Counter {
	return s.metrics.intermediates.WithLabelValues(code, method)
}

// ImpersonatedWatchesForTest is one series of
// trustbridge_certservice_impersonated_bundle_watches_total.
func (s *Service) ImpersonatedWatchesForTest(code string) prometheus.Counter {
	return s.metrics.impersonatedWatches.WithLabelValues(code)
}

// OnQueuedForTest has f called by every signing request that starts
// waiting for a signing slot, once it counts against the queue's bound.
func (s *Service) OnQueuedForTest(f func()) { s.admission.queued.Store(&f) }

// QueueWaitingForTest is trustbridge_certservice_signing_queue_waiting.
func (s *Service) QueueWaitingForTest() prometheus.Gauge { return s.metrics.queueWaiting }
