// Package caclient is the client side of trustbridge's certificate
// service (Istio's IstioCertificateService/CreateCertificate over gRPC and
// TLS): it verifies the server as the X509-SVID of its SPIFFE ID against
// given roots, sends a CSR for a key the caller generated, checks the
// answer and writes it to disk the way `trustbridge ca issue` does. The
// `ca request` command and the node agent share it; it imports no domain
// package, so the caller brings the key.
//
//	serverID, err := caclient.ExpectedServerID(roots, spiffeid.ID{})
//	tlsCfg := caclient.ServerTLS(roots, serverID, nil)
//	chain, err := caclient.CreateCertificate(ctx, addr, tlsCfg, caclient.Request{Key: key, Token: token})
//	leafChain, issuedRoots, id, err := caclient.CheckIssued(chain, key, serverID.TrustDomain(), spiffeid.ID{})
//	err = caclient.WriteCredentials(dir, key, leafChain, issuedRoots)
//
// The identity service on the same listener (trustbridge.identity.v1,
// authenticated the same way) gives MintJWTSVID (JWTBatcher coalesces the
// mints goroutines ask for at once into MintJWTSVIDs calls), and WatchBundles and
// FetchBundles, the caller's SPIFFE bundle map as the server's trust
// policy filters it, each message bounded and checked by
// ParseWatchBundles; WatchBundlesWith lets a node agent watch a workload
// of its node instead (WatchOptions.Impersonate, refusing a message for
// anyone else) and have peer-limited trust domains with their peers
// (WatchOptions.PeerLimits). Each message's tainted authorities and
// re-issue spread are read strictly into Bundles.Tainted (an entry that
// does not read is left out and named in Bundles.TaintedErr, the bundles
// still taken); SignedBy and TaintedKeyID match credentials against
// them. All take a connection from Dial, which `jwt`
// and the agent share. ParseBundles and JWTSource turn a bundle file into
// what jwtsvid.Validate takes.
//
// Error messages name the flags `ca request` and `agent` share
// (--root-cert, --server-spiffe-id, --ca-addr), as they are what the
// person reading them can change.
//
// References: istio.io/api security/v1alpha1 IstioCertificateService, the
// X509-SVID specification §4 and §5.
package caclient
