// Package broker serves brokers (Istio's ztunnel, Cilium's mutual
// authentication: node proxies that terminate mTLS for the workloads of
// their node) the identities of those workloads, over two APIs on one
// gRPC server:
//
//   - the SPIFFE Broker API (spiffe.broker.API, go-spiffe's
//     exp/proto/spiffe/broker): SubscribeToX509SVID,
//     SubscribeToX509Bundles, FetchJWTSVID and SubscribeToJWTBundles for
//     a workload named by a WorkloadPIDReference or a
//     KubernetesObjectReference to a Pod (ParseReference); every call
//     carries the metadata "broker.spiffe.io: true" (Header), else
//     InvalidArgument;
//   - SPIRE's Delegated Identity API
//     (spire.api.agent.delegatedidentity.v1, spire-api-sdk's generated
//     code), so brokers written against SPIRE's agent work unchanged: a
//     workload by pid, or by selectors that name a pod of this node
//     (ParseDelegated; the other selectors are facts the pod must have).
//     Its bundle streams name no workload, so they carry the trust of the
//     broker's own identity, which the trust policy grants as any
//     workload's.
//
// Who may broker is a Policy (ParsePolicy: "sa:<ns>/<name>", "uid:<n>",
// a SPIFFE ID: a certificate's over mutual TLS, else the identity map's),
// checked against the caller as the Node attests it when
// each call opens and at every recheck; every other caller is refused
// with PermissionDenied naming the rules. A broker never picks an
// identity: it names a workload, which the Node verifies exists on this
// node and attests itself (a pid's cgroups, the pod as the API server
// has it), and the identity is what the Node's identity map gives those
// facts. A workload gets the bundles its own trust policy grants it.
//
//	srv, err := broker.New(broker.Config{Node: node, Policy: policy, JWT: minter})
//	gs := grpc.NewServer(grpc.Creds(attestor.CredentialsWithTLS(mtlsConfig)))
//	srv.Register(gs)
//	go gs.Serve(unixListener)
//
// Streams. Each sends the workload's State at once and again on every
// change of what it carries (a rotation, a federated bundle change, a
// trust policy change); every message is complete (§4.4). A stream
// authorises its broker and resolves its reference again whenever the
// Workload's Gone channel closes (the process exited, the node's pods
// changed) and every RecheckInterval: a workload that went away ends it
// with NotFound, one no longer entitled with PermissionDenied, a broker
// no longer allowed with PermissionDenied (§4.9). Refusals of a
// reference carry google.rpc.ErrorInfo with domain "spiffe.io" and
// reason WORKLOAD_REFERENCE_INVALID, WORKLOAD_NOT_FOUND or
// WORKLOAD_NOT_ENTITLED (§4.8).
//
// Audit: every call served is logged with the broker's attested identity,
// the reference and the workload's SPIFFE ID, and every refusal with the
// reason, both rate limited; trustbridge_broker_requests_total{api,
// method, code}, trustbridge_broker_streams{api, method} and
// trustbridge_broker_pushes_total{api, method} count them.
//
// Transport. The Broker Endpoint specification asks for mutual TLS with
// X509-SVIDs; SPIRE serves its Delegated Identity API in plaintext on its
// admin socket. The node agent serves both on one unix socket
// (attest.Attestor.CredentialsWithTLS): the kernel names every caller
// first (SO_PEERCRED, then attestation), which on one node proves more
// than a certificate a process could have been handed, and a broker over
// mTLS adds its X509-SVID, whose SPIFFE ID is then the Caller's ID
// (Caller.Certified) that a SPIFFE ID rule matches.
//
// References: the SPIFFE Broker API and Broker Endpoint specifications,
// SPIRE's pkg/agent/api/delegatedidentity/v1.
package broker
