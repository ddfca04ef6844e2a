// Package agent is trustbridge's node agent: it runs next to one
// workload's Envoy and serves it, over the Envoy Secret Discovery Service
// on a unix socket, the workload's X509-SVID ("default") and the
// validation contexts ("ROOTCA", "ALL", "spiffe://<td>") of every trust
// domain the workload trusts.
//
// Run follows the Istio agent's decision flow:
//
//  1. an SDS server already answers on the socket: Run returns
//     ErrAlreadyServing and nothing else happens;
//  2. cert-chain.pem, key.pem and root-cert.pem are all in the credentials
//     directory: they are served and polled, and a change is pushed;
//  3. otherwise a Rotator obtains and renews the workload certificate from
//     the trustbridge server's certificate service, and the validation
//     contexts are relayed from the server's own SDS stream, so a
//     federation change reaches Envoy as soon as the server pushes it.
//
// Usage:
//
//	a, err := agent.New(agent.Config{Rotator: &agent.RotatorConfig{...}})
//	if err != nil { ... }
//	err = a.Run(ctx) // errors.Is(err, agent.ErrAlreadyServing): exit 0
//
// The agent relays what the server decided for its workload and never
// widens it: the server's ALL carries only the trust domains the
// workload may trust, with their peer limits as URI SAN matchers; the
// relay maps each matcher back to its trust domain (refusing, with a
// NACK, any it cannot) and gives the local SDS server a policy granting
// exactly those, so local ALL and spiffe://<td> answers carry the same
// matchers and any other trust domain is denied, explicitly where the
// agent knew it before. Until the server's first ALL only the local trust
// domain is served.
//
// Config.RootCA set to sds.RootCASPIFFE makes the local ROOTCA what the
// local ALL is (Envoy's SPIFFE validator with every trust domain the
// server's decision grants the workload, with its peer limits), as SPIRE's
// agent serves it with default_all_bundles_name = "ROOTCA": Istio's
// sidecars ask for ROOTCA only, so this is how they verify federated
// peers. The default, sds.RootCALocal, serves the local roots, as Istio's
// agent does. The mode is the agent's own: the server's ROOTCA, which the
// relay reads as the local roots, is not affected.
//
// Access control on the socket is its file mode, as with the Istio agent:
// every caller that can connect is served the one workload identity this
// agent holds. The socket is 0600 (0660 with Config.SocketGroup).
//
// "Answers" means a gRPC server completes a FetchSecrets for ROOTCA with any
// status but Unimplemented (an error status is still an answer); a socket
// nobody listens on, or whose listener does not speak gRPC within a short
// timeout, is stale and is replaced. A gRPC server without SDS is left
// alone and Run fails. Anything at the socket path that is not a socket
// (file, directory, symlink) is never removed.
//
// With Config.WorkloadAPISocket the agent also serves the SPIFFE Workload
// API (sds/workload) on a socket of its own, for the same identity:
// clients find it through SPIFFE_ENDPOINT_SOCKET=unix://<absolute path>,
// which the agent logs. It opens with the SDS socket, is handled the same
// way (0600, or 0660 with Config.WorkloadAPISocketGroup; a stale socket
// replaced, one a gRPC server answers on left alone and Run fails). With
// a CA the SVID is the Rotator's (a rotation is pushed), the bundles are
// the server's WatchBundles (the trust domains the trust policy lets the
// workload trust, JWT authorities included; those granted only for some
// peers are withheld, since a bundle cannot carry that limit) and
// JWT-SVIDs come from the server's MintJWTSVIDs (the mints asked at once
// in one call), reused per audience set
// for half their lifetime. While the server is unreachable the last good
// bundles are served, marked stale, with one warning per outage and
// trustbridge_agent_bundles_connected 0; the local roots the Rotator's
// latest certificate came with are added to them (before the first
// WatchBundles answer they replace the first certificate's). From credential files the SVID
// and bundles are the files' (bundle.spiffe.json may carry JWT
// authorities) and FetchJWTSVID is Unavailable.
//
// Every WatchBundles stream (the Workload API's, a node's per workload,
// or one followed for this alone when there is no Workload API) carries
// the server's tainted authorities: an X509-SVID one of them signed is
// re-issued at a uniformly random point of the server's re-issue spread
// (taintDelay), pushed as a renewal is, the old one served until then and
// while the re-issue fails; one still signed by a tainted authority is
// asked for again with backoff. Cached JWT-SVIDs whose kid is tainted are
// dropped. trustbridge_agent_taint_reissues_total counts the re-issues.
//
// For a node agent serving many workloads, an IdentityCache holds one
// X509-SVID per workload identity, shared by every process with that
// identity (as ztunnel's SecretManager does), and an ImpersonationFetcher
// obtains each: the agent authenticates as its node
// ((*Rotator).NodeCredentials: its service account token) and names the
// workload with Istio's ImpersonatedIdentity; the server grants it only
// for a pod on that node, and the agent checks the answer (exactly that
// SPIFFE ID, for its own key, chaining to the local roots). Keys are
// generated in the agent, never sent, and each process's handle serves
// its own identity only. An identity is fetched on first Acquire
// (concurrent ones share the fetch), renewed at half its lifetime give or
// take 5%, served while the server is unreachable until it expires and
// never after, and dropped, its key zeroed, DefaultIdentityLinger (one
// minute) after its last holder released it. At most
// DefaultMaxIdentities (1,000, SPIRE's agent's bound) are held: at the
// bound the one released longest ago makes room, and when every one is
// held a new identity is refused (ErrIdentityCacheFull).
//
//	c, err := agent.NewIdentityCache(agent.IdentityCacheConfig{Fetcher: f})
//	go c.Run(ctx)
//	h, err := c.Acquire(ctx, id) // per attested process
//	defer h.Release()
//	// h is the sds.CredentialSource of that process's streams
//
// Metrics: trustbridge_agent_credential_file_loads_total{result},
// trustbridge_agent_relay_responses_total{result},
// trustbridge_agent_relay_stream_failures_total and
// trustbridge_agent_relay_connected,
// trustbridge_agent_bundles_responses_total{result},
// trustbridge_agent_bundles_stream_failures_total and
// trustbridge_agent_bundles_connected, the identity cache's
// trustbridge_agent_identity_entries,
// trustbridge_agent_identity_fetches_total{result},
// trustbridge_agent_identity_renewals_total,
// trustbridge_agent_identity_refusals_total,
// trustbridge_agent_identity_evictions_total,
// trustbridge_agent_identity_stale and
// trustbridge_agent_identity_expirations_total, besides the SDS
// server's, the Workload API server's and the Rotator's.
//
// References: envoy.service.secret.v3.SecretDiscoveryService,
// envoy.extensions.transport_sockets.tls.v3.SPIFFECertValidatorConfig, the
// xDS protocol's ACK/NACK rules, the X509-SVID specification §5, and
// the SPIFFE Workload Endpoint and Workload API specifications.
package agent
