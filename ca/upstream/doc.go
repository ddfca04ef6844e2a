// Package upstream holds what the clients of upstream authorities
// (ca.UpstreamAuthority: the trustbridge and kubecsr packages below it)
// and the CA that drives them share: how a client says that the upstream
// refused, rather than could not be reached.
//
// A refusal (the upstream denied our identity or our request, or
// answered with what can never be used) is not mended by asking again:
// the CA retries it at its longest backoff, counts it as
// trustbridge_ca_upstream_requests_total{result="refused"} and says so in
// /readyz and its status, where an unreachable upstream is retried from a
// few seconds on.
//
//	if st.Code() == codes.PermissionDenied {
//		return nil, upstream.Refused(fmt.Errorf("upstream refused %s: %s", id, st.Message()))
//	}
//
// See docs/upstream-authority.md.
package upstream
