// Package federation is trustbridge's side of SPIFFE Federation: it knows
// which foreign trust domains to federate with and how to reach and
// authenticate their bundle endpoints, and will also poll those endpoints
// and keep the trust store of fetched bundles. This part holds the endpoint
// configuration: the Istio-compatible string form used by --federate and
// SPIFFE_BUNDLE_ENDPOINTS ("td|url" tuples joined by "||", with an optional
// third field naming the endpoint SPIFFE ID for https_spiffe), and a YAML
// file using spire-controller-manager's ClusterFederatedTrustDomain field
// names, which can also carry a bootstrap bundle and refresh bounds. Both
// forms share one set of validation rules, refuse the whole configuration
// on any error, and name entries by 0-based index ("endpoint 0",
// "federation[0]").
//
//	flagEps, err := federation.ParseEndpoints(os.Getenv("SPIFFE_BUNDLE_ENDPOINTS"))
//	if err != nil {
//		return err
//	}
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
//
// Spec: SPIFFE Federation §5.1 (endpoint parameters), §5.2.1.1 and §5.2.2.1
// (endpoint URL requirements), §5.2.2.2 (endpoint SPIFFE ID, self-serving
// endpoints and their bootstrap bundle), §7.2 (explicitly-defined
// parameters).
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Federation.md#51-endpoint-parameters
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Federation.md#5211-endpoint-url-requirements
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Federation.md#5222-endpoint-parameters
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Federation.md#72-explicitly-defined-endpoint-parameters
package federation
