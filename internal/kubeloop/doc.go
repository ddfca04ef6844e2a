// Package kubeloop is the watch loop trustbridge's cluster-scoped resource
// controllers share (ClusterFederatedTrustDomain in federation/crd,
// ClusterTrustPolicy in internal/trustpolicy/policycrd): a dynamic informer
// on one resource, a rate-limited work queue holding a single key (every
// change leads to one full sync, since each controller applies the whole
// set of resources at once), an optional events recorder, and a ticker
// that syncs again so that statuses follow what the server observes
// between changes. It also holds the pieces around the loop both
// controllers use: the status write, the Ready condition's transition time
// and refusal events reported once. Each controller keeps its own metric
// definitions, written out where docs/metrics.md's generator reads them.
//
// Usage:
//
//	err := kubeloop.Run(ctx, kubeloop.Config{
//		Dynamic: dyn, GVR: GVR, Kind: "ClusterTrustPolicy",
//		Events: clientset, Interval: 30 * time.Second,
//		Sync: func(ctx context.Context, l kubeloop.Lister, rec events.EventRecorder) error {
//			objs, err := l.List(labels.Everything())
//			// judge objs, apply them, write statuses with UpdateStatus
//		},
//	})
//
// The controller pattern follows client-go's workqueue example
// (https://github.com/kubernetes/client-go/tree/master/examples/workqueue);
// statuses are written through the status subresource
// (https://kubernetes.io/docs/concepts/extend-kubernetes/api-extension/custom-resources/#status-subresource).
package kubeloop
