package certservice

import "github.com/prometheus/client_golang/prometheus"

// GrantChecksForTest is one series of
// trustbridge_certservice_renewal_grant_checks_total.
func (s *Service) GrantChecksForTest(method, result string) prometheus.Counter {
	return s.metrics.grantChecks.WithLabelValues(method, result)
}
