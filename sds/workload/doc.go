// Package workload serves the SPIFFE Workload API
// (spiffe.workload.SpiffeWorkloadAPI, go-spiffe's proto) on a listener,
// for the one identity its Source holds or, with a Selector, for each
// caller its own: go-spiffe's, java-spiffe's and py-spiffe's clients,
// spiffe-helper and anything else that reads SPIFFE_ENDPOINT_SOCKET get
// their X509-SVID, JWT-SVIDs and bundles from it. trustbridge's node
// agent runs it on a unix socket next to its SDS socket (sds/agent).
//
//	cell := workload.NewCell()
//	_ = cell.Set(workload.State{SVID: &workload.SVID{ID: id, Chain: chain, Key: key}, Bundles: bundles})
//	srv, err := workload.New(workload.Config{Source: cell, JWT: minter})
//	err = srv.Serve(ctx, ln) // until ctx is done
//
// Per caller. A node agent serving every process of its node attests each
// caller and serves it the Source of the identity the caller's facts
// grant; callers of one identity share one Cell, and with it one encoding
// per State:
//
//	sel := workload.SelectorFunc(func(ctx context.Context) (workload.Source, func(), error) {
//		id, err := attestAndMap(ctx) // sds/attest's facts through the identity map
//		if err != nil {
//			return nil, nil, err // wrapping authn.ErrNotAttested, and authn.ErrUnavailable to retry
//		}
//		cell, release := cells.acquire(id) // one Cell per identity, while it has callers
//		return cell, release, nil
//	})
//	srv, err := workload.New(workload.Config{
//		Selector: sel, Credentials: attestor.Credentials(), CallerJWT: minter,
//	})
//
// The Selector is asked on every unary call and stream, and again while a
// stream is open: on every change of its Source's State and every
// ReselectInterval (10 minutes by default), so a stream follows its
// caller's identity (a pod whose service account changed, a rule
// withdrawn): another Source is switched to and its State sent, a refusal
// ends the stream with its status; a stream never goes on with an
// identity its caller no longer has. A refusal is PermissionDenied with
// the Selector's reason (the caller's operator reads it), Unavailable
// when it wraps authn.ErrUnavailable (the client retries); both are
// counted and logged, rate limited. CallerJWTMinter mints for the
// caller's own SPIFFE ID only, and ValidateJWTSVID uses the caller's
// bundles.
//
// What it serves:
//
//   - FetchX509SVID streams the SVID (chain leaf first, PKCS#8 key, the
//     bundle of its own trust domain) and, as federated_bundles, every
//     other trust domain of the State; FetchX509Bundles streams every
//     trust domain's X.509 authorities; both as ASN.1 DER, the
//     certificates concatenated (§5.2). FetchJWTBundles streams each
//     trust domain's JWT authorities as a JWKS document (§6.2). Each
//     stream sends at once and again on every change of what it carries;
//     a trust domain that leaves the State leaves the next message.
//   - FetchJWTSVID asks the JWTMinter for a token for the held identity
//     (the CallerJWTMinter for the caller's); an audience is required and
//     a spiffe_id other than that identity is refused with
//     PermissionDenied (§6.2).
//   - ValidateJWTSVID checks a token against the JWT authorities of its
//     subject's own trust domain only (internal/jwtsvid.Validate: no alg
//     none, no HMAC, known kid, time and audience) and answers its SPIFFE
//     ID and claims; an invalid token is InvalidArgument (§6.3).
//   - Without an identity every call is PermissionDenied "no identity
//     issued" (§5.2, §6.2); a call without the metadata
//     "workload.spiffe.io: true" is InvalidArgument (Workload Endpoint,
//     as SPIRE does). The WIT-SVID profile is Unimplemented.
//
// With a Source, whoever can connect is the workload: access control is
// the socket's file mode, as with the node agent's SDS socket; the server
// has no other notion of the caller. With a Selector, the caller is
// whoever the Selector says from the call's context (Workload Endpoint
// §5: identified out of band, by attestation).
//
// Fan-out. A State is encoded once into its three stream responses,
// shared by every stream (a codec sends the bytes as they are), streams
// still on a State a newer one replaced included (the encoding is kept
// with the State the Cell published, so the streams of every caller
// selected to one Cell share it too), and a response equal to the
// previous State's keeps its identity, so a stream compares pointers to
// know whether it has something to send. A rotation to 10,000
// FetchX509SVID watchers costs one marshal and 10,000 writes
// (BenchmarkWorkloadFanout; through a Selector,
// BenchmarkWorkloadFanoutSelect).
//
// Metrics: trustbridge_workload_api_streams{method},
// trustbridge_workload_api_requests_total{method,code},
// trustbridge_workload_api_pushes_total{method},
// trustbridge_workload_api_encodings_total,
// trustbridge_workload_api_selection_refusals_total{method,code} (with a
// Selector) and trustbridge_workload_api_stale (1 while State.Stale is
// set; the server also logs when that changes; with a Source only).
//
// References:
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Workload_API.md
// (§4.3 stream responses, §4.6 federated bundles, §5 X.509-SVID profile,
// §6 JWT-SVID profile),
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Workload_Endpoint.md
// (transport, SPIFFE_ENDPOINT_SOCKET, the security header, §5
// authentication by attestation, error codes),
// https://github.com/spiffe/spiffe/blob/main/standards/JWT-SVID.md.
package workload
