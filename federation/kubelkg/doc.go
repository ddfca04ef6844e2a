// Package kubelkg keeps the last known good bundle of each federated trust
// domain in a Kubernetes ConfigMap (bundles are public: no Secret needed),
// so that every trustbridge replica trusts what the leader fetched.
//
// It implements federation.LastKnownGood. Each trust domain has its own
// ConfigMap, named deterministically from the trust domain: a readable
// part (trust-domain characters that object names cannot hold become
// "-") and a hash of the full name, so names never collide and always
// fit. The trust domain itself is recorded in an annotation and in the
// entry, and both are checked on every load: a ConfigMap renamed, copied
// or edited to hold another domain's keys is refused (SPIFFE Federation
// §4.2: never mix trust domains). Writes use the resourceVersion they read
// (optimistic concurrency), never move a bundle's sequence backwards, and
// only the leader writes.
//
//	lkg, err := kubelkg.New(kubelkg.Config{Client: cs, Namespace: ns, Leader: elector})
//	poller, err := federation.NewPoller(federation.PollerConfig{LKG: lkg, ...})
//	go lkg.Watch(ctx, func(td spiffeid.TrustDomain) { _ = poller.LoadLastKnownGoodFor(td) })
package kubelkg
