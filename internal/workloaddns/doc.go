// Package workloaddns turns the SPIFFE ID of a Kubernetes workload into a
// DNS name for its certificate, OSM style, from an operator's template
// such as "{sa}.{ns}.{td}" or "{sa}.{ns}.svc.cluster.local". Clients that
// check host names (Open Service Mesh, plain TLS) can then talk to mesh
// workloads whose certificates are X509-SVIDs.
//
//	t, err := workloaddns.Parse("{sa}.{ns}.svc.cluster.local", td, servingNames...)
//	names, err := t.Names(id, grant) // nil, nil: not a Kubernetes identity
//
// The name sits beside the SPIFFE URI SAN, never instead of it: X509-SVID
// §2 allows other SAN types next to the one URI SAN. It is given only to
// identities a Kubernetes service account token proved (the grant method is
// kubernetes-jwt or kubernetes-issuer, on a first issuance or copied into a
// renewal), whose SPIFFE ID is exactly spiffe://<td>/ns/<namespace>/sa/<name>.
//
// The template language is literal text plus the placeholders {sa}, {ns}
// and {td}; Parse refuses anything else. Each placeholder must fill a whole
// DNS label (preceded by the start or '.', followed by '.' or the end), and
// each substituted namespace and service account name must be one DNS
// label, so that two workloads never share a name: a service account named
// "a.b" gets no DNS name rather than one that might collide. Wildcards are
// never produced. See RFC 1123 §2.1 (host names) and RFC 5280 §4.2.1.6.
package workloaddns
