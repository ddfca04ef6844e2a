// Package istiotest runs Istio's own client code against a real trustbridge
// binary: the istio-agent's citadel CA client
// (istio.io/istio/security/pkg/nodeagent/caclient/providers/citadel) and its
// secret cache (istio.io/istio/security/pkg/nodeagent/cache,
// SecretManagerClient), so that the certificate service's responses are
// decoded exactly as a sidecar decodes them. Istio's cache takes the last
// cert_chain element as the whole root bundle it hands Envoy as ROOTCA,
// which is why trustbridge sends every root in that one element, as istiod
// does.
//
// The agent's whole flow runs too (TestIstioAgentSDS): Istio's own SDS
// server (istio.io/istio/security/pkg/nodeagent/sds) serves that cache on
// the agent's unix socket, and an Envoy-like client built on
// go-control-plane's SDS stubs watches default and ROOTCA there, ACKing each
// response, through a workload certificate renewal at the grace ratio and a
// trustbridge root rotation.
//
// The guide for Istio users, docs/istio.md, is checked here too
// (TestIstioDoc*): its local steps run as written and their environment is
// handed to Istio's agent code (pilot-agent's option parsing,
// FindRootCAForCA, the citadel client) in a process of its own; its Helm
// values, mesh config and commands are checked against the pinned chart's
// values.yaml, the MeshConfig proto, Istio's registered environment
// variables and trustbridge --help; a fenced block no test knows fails.
//
// It is a module of its own so that istio.io/istio never enters trustbridge's
// dependency graph (binary size, CVE surface). The tests drive the binary
// as a subprocess; only the throughput benchmark's in-process baseline
// imports a trustbridge package (ca, through the replace directive in
// go.mod), so this module builds Istio against trustbridge's versions of
// the dependencies they share:
//
//	make istio-tests
//	# or, with a binary built elsewhere:
//	cd internal/testkit/istiotest && TRUSTBRIDGE_BIN=/path/to/trustbridge go test ./...
//
// Without TRUSTBRIDGE_BIN the tests skip, unless TRUSTBRIDGE_ISTIO_TESTS=require,
// which fails them instead. See issue 15, items 1 and 3, and the README's
// Istio section.
package istiotest
