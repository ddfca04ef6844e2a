// Package dialguard judges the addresses an outbound fetch of a
// configured URL may connect to, after name resolution, so that a URL (or
// a redirect, or a DNS answer) cannot point trustbridge at itself, at a
// link-local neighbour or at a cloud metadata service (SSRF, Istio
// CVE-2026-41413). Federation's bundle fetches and the OIDC issuer key
// fetches share it.
//
//	dialer := &net.Dialer{Control: dialguard.Control(allowPrivate, "--federation-allow-private")}
//	transport := &http.Transport{Proxy: nil, DialContext: dialer.DialContext}
//
// Classify sorts an address into three classes: Open (anything else,
// including RFC 1918 and ULA ranges, where in-cluster and same-VPC peers
// live), Local (loopback, unspecified, 0.0.0.0/8 and link-local: a lab or
// a test reaches a peer this way, so an operator may allow them) and
// Never (metadata and credential services, multicast and broadcast). An
// IPv6 address that carries an IPv4 address (IPv4-mapped, -compatible or
// -translated, NAT64 RFC 6052/8215, 6to4 RFC 3056, Teredo RFC 4380) is
// judged by the strictest of its own class and that of the addresses it
// carries.
//
// The check belongs in net.Dialer.Control, which sees every address
// dialed (each one a resolver returned, each redirect target) before any
// packet is sent; checking the URL's host name alone would miss DNS
// rebinding. Callers must also disable proxies, or the dialer sees the
// proxy rather than the peer.
package netutil
