// Package federation is trustbridge's side of SPIFFE Federation: which
// foreign trust domains to trust, how to reach and authenticate their
// bundle endpoints, and how their bundles are fetched, judged and kept.
//
// Configuration: the Istio-compatible string form used by --federate and
// SPIFFE_BUNDLE_ENDPOINTS ("td|url" tuples joined by "||", with an optional
// third field naming the endpoint SPIFFE ID for https_spiffe and a fourth
// naming its bootstrap bundle file), and a YAML file using
// spire-controller-manager's ClusterFederatedTrustDomain field names, which
// can also carry a bootstrap bundle and refresh bounds. Both forms share one
// set of rules, refuse the whole configuration on any error, and name
// entries by 0-based index ("endpoint 0", "federation[0]"). CheckFirstFetch
// is the one rule every configuration path applies before polling: the
// trust domain of an https_spiffe endpoint's SPIFFE ID must have roots in
// the trust store at the first fetch (a self-serving endpoint's bootstrap
// bundle or a held bundle; for a hub, ours, held, or brought in by the
// endpoint federating with it).
//
// Judging: CheckBundle is the verdict on every fetched document (a root
// naming another trust domain, then Accept over the held bundle), and
// CheckDocument is it from the raw document, as `trustbridge bundle
// inspect` runs it.
//
// Polling: a Poller gives every trust domain its own schedule (the clamped
// refresh hint with jitter, backoff from 1s on failure). A Fetcher fetches
// with one deadline, a size cap, If-None-Match, status 200 (or 304) only,
// no fallback between profiles, identity checked in VerifyConnection,
// bounded https-only redirects and no loopback or metadata addresses.
// Accept refuses a bundle whose sequence goes back, whose keys change
// under the same sequence, or that revokes everything (unless allowed);
// every refusal keeps the last good bundle, which LKGStore persists so a
// restart keeps trust. Each trust domain's revoked set (Revoked: what its
// accepted bundles listed in trustbridge_revoked, until each entry's exp)
// persists with it, and a bundle carrying one of them is refused
// (ErrRevokedAuthority), whatever its sequence. Accepted bundles go to a Sink, the per-trust-domain
// store of package federation/trust.
//
//	flagCfg, err := federation.ParseEndpointsConfig(os.Getenv("SPIFFE_BUNDLE_ENDPOINTS"), os.ReadFile)
//	if err != nil {
//		return err
//	}
//	flagEps := flagCfg.Endpoints
//	cfg, err := federation.ParseConfig(data, func(p string) ([]byte, error) {
//		return os.ReadFile(filepath.Join(configDir, p))
//	})
//	if err != nil {
//		return err
//	}
//	for _, w := range cfg.Warnings {
//		log.Warn("federation config", "warning", w)
//	}
//	eps, err := federation.MergeEndpoints(flagEps, cfg.Endpoints)
//	anchors := &federation.Anchors{Local: localTD, Endpoints: eps, Held: func(td spiffeid.TrustDomain) bool {
//		return federation.StoreHolds(lkg, td)
//	}}
//	for _, ep := range eps {
//		if err := federation.CheckFirstFetch(ep, anchors); err != nil {
//			return err
//		}
//	}
//
// Spec: SPIFFE Federation §5.1 (endpoint parameters), §6.2 (maintaining a
// relationship: polling, refresh hints), §7.5.1 (redirects), §5.2.1.1 and §5.2.2.1
// (endpoint URL requirements), §5.2.2.2 (endpoint SPIFFE ID, self-serving
// endpoints and their bootstrap bundle), §7.2 (explicitly-defined
// parameters).
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Federation.md#51-endpoint-parameters
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Federation.md#5211-endpoint-url-requirements
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Federation.md#5222-endpoint-parameters
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Federation.md#72-explicitly-defined-endpoint-parameters
package federation
