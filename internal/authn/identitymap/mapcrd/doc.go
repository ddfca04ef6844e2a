// Package mapcrd is the Kubernetes side of identity maps: the
// ClusterIdentityMapping resource (trustbridge.dev/v1alpha1,
// cluster-scoped, deploy/base/identitymapping-crd.yaml), whose spec is one
// identity map rule (internal/authn/identitymap) named after the
// resource, in the style of spire-controller-manager's ClusterSPIFFEID.
//
// The Controller watches the resources with a dynamic informer
// (internal/kube/crdcontroller), as policycrd watches ClusterTrustPolicy.
// Each resource becomes an identitymap.Rule (Name the resource's name,
// Origin "crd:<name>") checked alone with identitymap.Compile, so an
// invalid resource is refused alone: Ready=False reason Invalid, with a
// message naming the spec field, and a Warning event; if an earlier
// generation was valid, that one stays in force. The valid rules go, as
// one set and only when it changes, to an Applier (the identity map
// Combiner's "crd" source, CombinerApplier). A set the Applier refuses (a
// rule name the --identity-map file uses too) leaves the set it last
// accepted in force, and the rules not in it get reason Refused. Only the
// leader writes statuses (Ready reason Accepted, the SPIFFE ID template,
// whether the server can check the rule for pods, and the rules it
// conflicts with) and events, and only when they differ, refreshed every
// StatusInterval. The server and the node agents both run it, the agents
// with IsLeader false: they read, never write.
//
//	ctl, err := mapcrd.New(mapcrd.Config{
//		Dynamic: dyn, Events: client, Map: identitymap.Config{TrustDomain: td},
//		Apply: mapcrd.CombinerApplier(comb), Current: comb.Map, IsLeader: elector.IsLeader,
//	})
//	go ctl.Run(ctx)
//	<-ctl.Synced() // the resources listed at start are in the map
//
// RBAC: get, list, watch clusteridentitymappings; the server also update,
// patch clusteridentitymappings/status and create, patch events.
//
// https://kubernetes.io/docs/concepts/extend-kubernetes/api-extension/custom-resources/#status-subresource
package mapcrd
