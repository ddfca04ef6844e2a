// Package trust is trustbridge's trust store and X509-SVID peer verifier.
// A Store keeps, per trust domain and per source (the embedded CA, each
// federation endpoint, each bundle file), the bundle that source last set;
// the effective bundle of a trust domain is the union over its sources, and
// bundles of different trust domains are never merged. Every change
// publishes a new immutable Snapshot (effective bundles plus one X.509 cert
// pool per trust domain) with an atomic swap, so readers never lock, and
// wakes subscribers (SDS, the CA) with a coalesced notification. Published
// keeps each source's bundle as that source set it, sequence number
// included, for readers that relay documents rather than trust them (the
// bundle endpoint); SubscribePublished also wakes for source changes that
// leave the union as it was.
//
// A Verifier is trustbridge's X509-SVID peer verifier, and what a Go
// program embedding trustbridge uses to authenticate peers of federated
// trust domains (see ExampleVerifier). It takes its roots from any
// x509bundle.Source (a Store, which answers from its current snapshot, an
// x509bundle.Set, or one bundle), verifies a chain against the roots of
// the trust domain named by the leaf's one SPIFFE ID, and only those, and
// then applies a go-spiffe tlsconfig.Authorizer (AuthorizeMemberOf,
// AuthorizeID, AuthorizeOneOf, ...); a nil Authorizer refuses everyone.
// The chain check is internal/svidcheck's, the one every X509-SVID in the
// binary goes through (the https_spiffe bundle endpoint client here, the
// mTLS authenticator of the SDS and certificate services, the node
// agent's check of the certificate service): go-spiffe's x509svid.Verify
// after a stricter leaf check (the URI SAN must be a canonical SPIFFE ID
// exactly as encoded) and with the extended key usage checked along the
// chain. ClientTLSConfig wires a Verifier into crypto/tls so that every
// handshake, resumed ones included, is checked against the store as it is
// at that moment; the https_spiffe fetcher uses it.
//
//	store := trust.NewStore()
//	store.Set("ca", ownBundle)                        // keyed by ownBundle.TrustDomain()
//	store.Set("federation:https://b.example/bundle", fetched)
//	v := &trust.Verifier{Bundles: store, Authorizer: tlsconfig.AuthorizeMemberOf(peerTD)}
//	id, err := v.VerifyPeer(rawCerts)
//	client := &http.Client{Transport: &http.Transport{TLSClientConfig: trust.ClientTLSConfig(svid.GetClientCertificate, v)}}
//
//	changed, cancel := store.Subscribe()
//	defer cancel()
//	for range changed {
//		push(store.Snapshot())
//	}
//
// Spec: X509-SVID §2 (exactly one URI SAN), §3.1 (leaf IDs have a path),
// §4.3 and §5.2 (leaf validation: CA=false, no keyCertSign or cRLSign),
// §5.1 (path validation), §6.2 (the X.509 bundle is the union of CA
// certificates); SPIFFE Federation §4.2 and §7.3 (bundles of different trust
// domains are never merged; the trust domain–bundle binding is preserved).
// https://github.com/spiffe/spiffe/blob/main/standards/X509-SVID.md#2-spiffe-id
// https://github.com/spiffe/spiffe/blob/main/standards/X509-SVID.md#31-leaf-certificates
// https://github.com/spiffe/spiffe/blob/main/standards/X509-SVID.md#52-leaf-validation
// https://github.com/spiffe/spiffe/blob/main/standards/X509-SVID.md#62-consuming-a-spiffe-bundle
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Federation.md#42-managing-fetched-bundles
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Federation.md#73-preserving-the-trust-domain-bundle-binding
package trust
