// Package identitymap decides which SPIFFE ID, X509-SVID TTL and DNS names
// a workload gets from what attestation proved about it: the node agent
// attests a caller of its sockets into Kubernetes facts (namespace,
// service account, pod, labels) and unix facts (uid, gid, binary), and the
// server knows the service account a token proved. Rules in the style of
// spire-controller-manager's ClusterSPIFFEID map selected workloads to ID
// and DNS name templates; without rules a Kubernetes workload gets the
// Istio form spiffe://<td>/ns/<namespace>/sa/<service account>, and
// anything else gets nothing, with an error saying how to give it an
// identity. It sits under authn because it is authentication's last step
// for attested callers: facts in, an identity out, never taken from what
// the caller asks for. It imports no domain package, so the agent (sds)
// and the server share it.
//
//	m, err := identitymap.Compile(identitymap.Config{TrustDomain: td, MaxTTL: ca.MaxWorkloadTTL}, doc.Rules)
//	ident, err := m.Identify(identitymap.Workload{Kubernetes: true, Namespace: "pay", ServiceAccount: "api", PodLabels: labels})
//	if errors.Is(err, identitymap.ErrConflict) { /* two rules, two IDs: serve nothing */ }
//	e := m.Explain(w) // policy explain, status pages
//
// # Rules
//
// A Rule selects workloads with Selectors (any selector; every field set
// in one must match): kubernetes, namespace, serviceAccount, podLabels (a
// Kubernetes label selector), uid, gid, binaryPath, binarySHA256. A
// selector with no field is refused, as is an empty label selector: a rule
// never selects everything by accident. `kubernetes: true` alone is how a
// rule says "every Kubernetes workload". Kubernetes fields never match a
// workload without Kubernetes facts, unix fields never one without unix
// facts (Workload.Kubernetes, Workload.Unix): uid 0 is a fact, not a
// default. A selector of unix fields only selects host processes, never a
// process in a pod, though it has unix facts too: any container can run
// as uid 65534 from a file it put at /usr/bin/node_exporter, and must not
// get the host exporter's identity. `kubernetes: true, uid: 1000` selects
// processes in pods by uid. So pod rules and host rules never conflict.
//
// Every rule that selects a workload must agree: the rules' IDs must be
// equal, or Identify fails with ErrConflict naming two of them; one rule
// is never picked over another, because rule order is no place for a
// security decision. Equal IDs merge: every rule's DNS names (each was
// allowed for this workload by the rule's author; at most
// MaxIdentityDNSNames in all, or ErrFacts naming the rules) and the
// shortest TTL set (0, the issuer's default, when none sets one). A rule
// that selects
// the workload but cannot fill its templates (a missing label, a value
// with "/") fails the workload with ErrFacts: skipping it would let a
// label change move a workload to another identity. Compile also reports
// the pairs of rules that may select the same workload and have different
// ID templates (Conflicts), for the status, the audit findings and
// `policy explain`, before any workload fails.
//
// The default applies only to workloads no rule selects (ClusterSPIFFEID's
// fallback): DefaultIstio, the default, gives a Kubernetes workload the
// Istio form and others nothing; DefaultNone gives nothing. So rules can
// be added for some workloads without taking identities from the rest.
//
// # Templates
//
// spiffeID and dnsNames are templates of literal text plus placeholders:
// {{.TrustDomain}}, {{.Namespace}}, {{.ServiceAccount}}, {{.PodName}},
// {{.PodUID}}, {{.NodeName}}, {{.ContainerName}}, {{.PodLabels.<key>}},
// {{.UID}}, {{.GID}}, {{.User}}, {{.Group}}; nothing else. It is the OIDC
// issuers' template language (internal/authn/oidc), not text/template:
// no functions, pipelines or conditionals, so a reviewer sees every ID a
// template can make, unknown fields are refused when the rule is parsed,
// and a fact can only fill the place its placeholder holds. An ID
// template must start with spiffe://{{.TrustDomain}}/ (or the local trust
// domain spelled out); {{.TrustDomain}} appears nowhere else; a path
// segment holds at most one placeholder ({{.Namespace}}-{{.PodName}} is
// the same for two different pods). Every value substituted must be
// exactly one SPIFFE ID path segment: 1 to 255 of A-Z a-z 0-9 . - _, not
// "." or "..". "/", "%2F", empty values and look-alike unicode are
// refused, not escaped, so no value can add a segment, climb out of its
// place or leave the trust domain; the result is parsed again by
// go-spiffe all the same. A DNS name template is lower case a-z 0-9 . -
// (no wildcards) plus placeholders, one to a label; each value must be
// part of one label (a-z 0-9 -): upper case is refused rather than
// folded, which could make two workloads share a name. BinaryPath and
// Image are not placeholders: they hold "/" and ":".
//
// # Sources
//
// Parse reads one strict YAML schema (unknown and duplicate keys, anchors
// and aliases refused, each error naming the line and field; at most
// MaxDocumentSize bytes and MaxRules rules):
//
//	default: istio                 # or none; optional
//	rules:
//	- name: payments-api           # DNS-1123 subdomain, unique
//	  workloads:                   # any of these; every field in one must match
//	  - namespace: payments
//	    serviceAccount: api
//	    podLabels:
//	      matchLabels: {app: api}
//	  spiffeID: "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/app/{{.PodLabels.app}}"
//	  ttl: 1h                      # optional, MinTTL to Config.MaxTTL
//	  dnsNames: ["{{.PodLabels.app}}.{{.Namespace}}.svc"]
//	- name: node-exporter
//	  workloads:
//	  - uid: 65534
//	    binaryPath: /usr/bin/node_exporter
//	  spiffeID: spiffe://{{.TrustDomain}}/node/exporter
//
// A Combiner merges every source's last good rules (a file, later the
// IdentityMapping resources, one rule each, as ClusterTrustPolicy
// carries trust policy rules) into one Map and publishes it in a Cell,
// which the agent reads without a lock on every attestation; a FileSource
// polls the file into it and keeps the last good rules when an edit is
// bad, the error in Status, the log and
// trustbridge_identity_map_reloads_total{result="error"}.
//
//	cell := identitymap.NewCell(nil)
//	comb, err := identitymap.NewCombiner(identitymap.Config{TrustDomain: td}, cell, identitymap.WithRegisterer(reg))
//	file := identitymap.NewFileSource(path, comb, logger, 0)
//	err = file.Load() // then go file.Run(ctx)
//	ident, err := cell.Load().Identify(w)
//
// Specs: SPIFFE ID §2 (trust domain, path segments), X509-SVID §2 (DNS
// SANs beside the URI SAN), RFC 1123 §2.1 (host names).
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE-ID.md#22-path
// https://github.com/spiffe/spiffe/blob/main/standards/X509-SVID.md#2-spiffe-id
// https://www.rfc-editor.org/rfc/rfc1123#section-2
package identitymap
