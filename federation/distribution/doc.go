// Package distribution puts the trust store into Kubernetes: a ConfigMap
// (default trustbridge-ca-root-cert) in every namespace matching a label
// selector, holding root-cert.pem (the local trust domain's X.509 roots),
// bundle.spiffe.json (a SPIFFE bundle map of every trust domain) and one
// <trust-domain>.pem per federated trust domain. Unlike trust-manager,
// which flattens every PEM into one pool, trust domains stay apart: a
// workload trusts a federated trust domain's roots for that trust domain
// only (SPIFFE Federation §7.3).
//
// Config.Kind KindSecret keeps the same keys in an Opaque Secret instead,
// under the same rules below; the server runs one controller per kind. An
// optional truststore.p12 (Config.Truststore) holds the local roots only,
// as a PKCS#12 truststore for Java: it cannot say which trust domain a
// root is for, so federated roots never go in. Config.Labels and
// Config.Annotations are set on every object written.
//
// A Controller renders each trust store snapshot once, and informers on
// Namespaces (label-selected) and on ConfigMaps of that name (field-selected,
// all namespaces) feed a rate-limited workqueue keyed by namespace. Writes
// use Update on the cached resourceVersion, so concurrent edits conflict and
// are retried; writes that would change nothing are skipped. A deleted or
// edited ConfigMap is restored. A namespace that stops matching the
// selector loses the ConfigMap: a copy nobody rotates would keep trusting
// roots long after they were retired. Only ConfigMaps labelled
// app.kubernetes.io/managed-by=trustbridge are ever updated or deleted; a
// same-named ConfigMap without the label is left alone, logged and counted.
// Two controllers (two trustbridge installations) must not share a
// ConfigMap name: each would delete the other's copies outside its own
// selector, and overwrite them inside it. Writes to one namespace are
// paced (a burst, then one a minute), so such a fight, or a webhook that
// rewrites the data, costs a trickle of writes rather than an update storm,
// and shows in trustbridge_distribution_throttled_total. A federated trust
// domain that would push the ConfigMap past the API server's 1 MiB is left
// out, so that one peer's oversized bundle cannot freeze the distribution
// of the local roots.
//
// The controller has no leadership fence: cmd runs it only while holding
// the leader Lease (from OnStartedLeading, with the leadership context),
// and followers do not run it at all. Run may be called again for a new
// term.
//
//	c, err := distribution.New(distribution.Config{
//		Client:            client,
//		Store:             store, // *trust.Store
//		TrustDomain:       td,
//		NamespaceSelector: selector, // labels.Parse(--namespace-selector)
//		Logger:            log,
//		Registerer:        reg,
//	})
//	if err != nil {
//		return err
//	}
//	go c.Run(leaderCtx)
//	// leader's readiness: c.Ready(); followers never run it, so their
//	// readiness must not include it
//
// Spec: SPIFFE Trust Domain and Bundle §4 (bundle format) and §5 (bundle
// map), SPIFFE Federation §7.3 (bundles of different trust domains are
// never merged).
// The ConfigMap is the analogue of Istio's istio-ca-root-cert, whose key
// root-cert.pem it shares. deploy/rbac holds the permissions it needs.
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Trust_Domain_and_Bundle.md
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Federation.md#73-preserving-the-trust-domain-bundle-binding
package distribution
