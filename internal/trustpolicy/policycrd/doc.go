// Package policycrd is the Kubernetes side of trust policies: the
// ClusterTrustPolicy resource (trustbridge.dev/v1alpha1, cluster-scoped,
// deploy/base/trustpolicy-crd.yaml), whose spec is one trust policy rule
// (internal/trustpolicy) named after the resource, and the service account
// labels that rules' label selectors read.
//
// The Controller watches the resources with a dynamic informer, like the
// ClusterFederatedTrustDomain controller (federation/crd). Every replica
// converts each resource to a trustpolicy.Rule (Name the resource's name,
// Origin "crd:<name>") and checks it alone with trustpolicy.Compile, so an
// invalid resource is refused alone: Ready=False reason Invalid, with a
// message naming the spec field, and a Warning event; if an earlier
// generation was valid, that one stays applied. The valid rules go, as one
// set and only when it changes, to an Applier (the policy Combiner's "crd"
// source). A set the Applier refuses leaves the set it last accepted in
// force, and the rules not in it get reason Conflict. Only the leader
// writes statuses (Ready reason Applied, the trust domains granted, the
// workloads matched, the conflicts reported) and events, and only when they
// differ, refreshed every StatusInterval.
//
//	ctl, err := policycrd.New(policycrd.Config{
//		Dynamic: dyn, Events: client, LocalTrustDomain: td,
//		Apply: policycrd.ApplyFunc(func(r []trustpolicy.Rule) error { return combiner.SetSource("crd", r) }),
//		Matched: access.Matched, IsLeader: elector.IsLeader, Registerer: reg,
//	})
//	labels, err := policycrd.NewServiceAccountLabels(client, logger)
//	go ctl.Run(ctx)
//	go labels.Run(ctx)
//
// RBAC (deploy/rbac/clusterrole.yaml): get, list, watch clustertrustpolicies;
// update, patch clustertrustpolicies/status; list, watch serviceaccounts in
// every namespace; create, patch events.k8s.io events in namespace default.
//
// Patterns are exact SPIFFE IDs or path prefixes ending in "/*", never
// regular expressions (Istio CVE-2026-39350); the CRD's schema refuses
// anything else at admission, and the controller checks the canonical
// spelling (SPIFFE ID spec §2.2 path segments: no "." or "..").
package policycrd
