// Package crdcontroller is what trustbridge's cluster-scoped resource
// controllers share (ClusterFederatedTrustDomain in federation/crd,
// ClusterTrustPolicy in internal/trustpolicy/policycrd): a
// controller-runtime controller over a dynamic informer on one resource,
// whose rate-limited queue holds a single request (every change leads to
// one full sync, since each controller applies the whole set of resources
// at once), an optional events recorder, and a ticker source that syncs
// again so that statuses follow what the server observes between changes.
// It also holds the pieces around the sync both controllers use: the
// status write, the Ready condition's transition time, refusal events
// reported once, and the skeleton of their three metrics. Each controller
// declares its own metrics (Metrics), written out where docs/metrics.md's
// generator reads them.
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
// The controller pattern follows controller-runtime's
// (https://pkg.go.dev/sigs.k8s.io/controller-runtime/pkg/controller);
// statuses are written through the status subresource
// (https://kubernetes.io/docs/concepts/extend-kubernetes/api-extension/custom-resources/#status-subresource).
package crdcontroller
