// Package sds is an Envoy Secret Discovery Service (v3) that hands
// workloads their X509-SVIDs and validation contexts holding the merged,
// per-trust-domain roots, including Envoy's SPIFFE certificate validator
// configuration. A Server authenticates every stream (and every
// FetchSecrets call) with an authn.Authenticator and serves, by resource
// name:
//
//   - "default", or the caller's own SPIFFE ID: its certificate chain and
//     PKCS#8 key (tls_certificate) from the CredentialSource. Another
//     workload's ID ends the stream with PermissionDenied; the source is
//     never asked for an identity the caller did not prove.
//   - "ROOTCA", or spiffe://<local trust domain>: the local roots
//     (validation_context.trusted_ca). With Config.RootCA set to
//     RootCASPIFFE, ROOTCA is instead exactly what ALL is for that caller,
//     named ROOTCA (see below), while spiffe://<local trust domain> still
//     names the local roots alone.
//   - spiffe://<trust domain>: that trust domain's roots only, sent once it
//     is known (delta streams get it in removed_resources when it goes).
//   - "ALL": every trust domain as envoy.tls.cert_validator.spiffe's
//     SPIFFECertValidatorConfig, or, when the node metadata sets
//     disable_spiffe_cert_validation, one trusted_ca with every root.
//
// Unknown names are not answered, and an empty list is not a wildcard.
//
// ROOTCA as ALL. Istio's sidecars only ever ask for ROOTCA as their
// validation context, so a mesh federates only if ROOTCA holds every
// trust domain: SPIRE's agent does that with default_all_bundles_name =
// "ROOTCA" (spire-agent's sds block). RootCASPIFFE (flag value "spiffe",
// ParseRootCAMode) is the same here: the SPIFFE validator with the trust
// domains the caller's decision allows and its peer limits, or one
// trusted_ca for nodes that set disable_spiffe_cert_validation; it is
// cached apart from the local ROOTCA and pushed, on SotW and delta
// streams, whenever ALL would be. The default, RootCALocal, is Istio's
// own agent's ROOTCA.
//
// Trust policy. With Config.Policy set (an AccessPolicy such as
// trustpolicy.Access), ALL (and ROOTCA as ALL) and spiffe://<td> carry only the
// trust domains the caller's trustpolicy.Decision allows; the local one
// always. A grant limited to some peers becomes
// match_typed_subject_alt_names (URI SAN, exact or prefix) on
// spiffe://<td>, and on ALL, which then lists every trust domain it holds
// ("spiffe://<td>/" for the local and unlimited ones): Envoy's SPIFFE
// validator applies them after the chain check, as the default validator
// does. A denied spiffe://<td> of a trust domain the server knows gets an
// explicit denial (DeniedSAN, a sentinel CA named "trustbridge trust
// policy: <td> denied" whose key was discarded), never silence or another
// domain's roots; delta streams get it as a resource. A stream decides
// when it opens, when the policy's channel fires and after each
// re-authentication, and pushes only when Decision.Key changed, so a
// policy edit reaches the affected streams at once and no others.
// Encodings are shared per (Trust, name, decision key) and kept only
// while an open stream holds that decision.
//
// A Minter with WorkloadDNSNames (--workload-dns-name-template) puts the
// template's DNS name beside the SPIFFE ID when the caller's grant is a
// Kubernetes token; the server hands it the authenticated identity
// (IdentityCredentialSource), and credentials with and without a name are
// cached apart.
//
//	trust := sds.NewTrustCell()
//	minter, err := sds.NewMinter(sds.MinterConfig{Signer: signer, TTL: time.Hour})
//	srv, err := sds.New(sds.Config{TrustDomain: td, Trust: trust, Credentials: minter, Authenticator: chain,
//		Policy: access}) // nil Policy: every caller trusts every trust domain
//	srv.Register(grpcServer)
//	err = trust.Set(bundles) // pushed to every stream that asked for them
//
// Design. The server is a handler written over go-control-plane's
// protos, as SPIRE's agent does, not go-control-plane's server and
// SnapshotCache: the cache keys snapshots by a hash of the node proto the
// client declares itself (we key by the identity we authenticated), builds
// one response per watch and marshals it per stream, and would hold the
// shared validation contexts once per identity. Here every resource is
// marshalled once per version and the bytes are shared: validation
// contexts once per Trust (the version is the first 8 bytes of the SHA-256
// of the marshalled secret, in hex, stable across restarts), certificates
// once per Credential and name, shared by the streams of one identity.
// Each stream has one goroutine that reads its requests and one that waits
// on them, the Trust's and the Credential's Changed channels and a timer
// at RefreshAt (when the caller is authenticated again before the source
// is asked again; a failure ends the stream with Unauthenticated, or
// Unavailable when the authentication backend is). Updates are never queued:
// a stream sends the newest state when it can, so a client that stops
// reading blocks only its own stream and costs one response of memory.
// A NACK is logged and counted and is not answered with the same version
// again; the next change is pushed.
//
// References: the xDS transport protocol
// (https://www.envoyproxy.io/docs/envoy/latest/api-docs/xds_protocol),
// envoy.service.secret.v3.SecretDiscoveryService and
// envoy.extensions.transport_sockets.tls.v3.SPIFFECertValidatorConfig
// (https://www.envoyproxy.io/docs/envoy/latest/api-v3/extensions/transport_sockets/tls/v3/tls_spiffe_validator_config.proto),
// X509-SVID §5 (https://github.com/spiffe/spiffe/blob/main/standards/X509-SVID.md#5-validation).
package sds
