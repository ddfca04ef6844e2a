// Package crdcontroller is what trustbridge's cluster-scoped resource
// controllers share (ClusterFederatedTrustDomain in federation/crd,
// ClusterTrustPolicy in internal/trustpolicy/policycrd,
// ClusterIdentityMapping in internal/authn/identitymap/mapcrd): a
// controller-runtime controller over a dynamic informer on one resource,
// whose rate-limited queue holds a single request (every change leads to
// one full sync, since each controller applies the whole set of resources
// at once), an optional events recorder, and a ticker source that syncs
// again so that statuses follow what the server observes between changes.
// It also holds the pieces around the sync the controllers use: the
// status write, the Ready condition's transition time, refusal events
// reported once, and the skeleton of their three metrics. Each controller
// declares its own metrics (Metrics), written out where docs/metrics.md's
// generator reads them.
//
// RuleSet is the sync of the controllers whose resources are one rule
// each: it judges each resource alone (a refused one keeps its last valid
// generation), applies the rules as one set (a refused set keeps the one
// last accepted), and writes each resource's Ready condition and, through
// the controller's Status, what the server made of it. The controller
// keeps its types, how a resource becomes a rule and what its status
// says.
//
// The controller runs unmanaged, not under a controller-runtime manager:
// it starts inside trustbridge's own process lifecycle, on every replica,
// and trustbridge's own leader election decides who writes.
//
// Usage:
//
//	err := crdcontroller.Run(ctx, crdcontroller.Config{
//		Dynamic: dyn, GVR: GVR, Kind: "ClusterTrustPolicy",
//		Events: clientset, Interval: 30 * time.Second,
//		Sync: func(ctx context.Context, l crdcontroller.Lister, rec events.EventRecorder) error {
//			objs, err := l.List(labels.Everything())
//			// judge objs, apply them, write statuses with UpdateStatus
//		},
//	})
//
//	rules, err := crdcontroller.NewRuleSet(crdcontroller.RuleSetConfig[ClusterTrustPolicy, trustpolicy.Rule, Status]{
//		Config: crdcontroller.Config{Dynamic: dyn, GVR: GVR, Kind: Kind, Interval: 30 * time.Second},
//		Rule: ruleOf, Apply: apply, Status: status, StatusOf: func(cr *ClusterTrustPolicy) Status { return cr.Status },
//		Metrics: metrics, Words: words,
//	})
//	err = rules.Run(ctx)
//
// The controller pattern follows controller-runtime's
// (https://pkg.go.dev/sigs.k8s.io/controller-runtime/pkg/controller);
// statuses are written through the status subresource
// (https://kubernetes.io/docs/concepts/extend-kubernetes/api-extension/custom-resources/#status-subresource).
package crdcontroller
