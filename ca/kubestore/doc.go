// Package kubestore keeps the CA state of ca.Authority in one Kubernetes
// Secret, so that several trustbridge replicas share it (--storage kube).
//
// The Secret (type Opaque, label app.kubernetes.io/managed-by=trustbridge)
// holds the journal under state.json and each root's certificate and
// private key under <id>.crt.pem and <id>.key.pem: the same encoding as the
// file store, so the same checks apply on load. Writes replace the whole
// state in one Update carrying the resourceVersion it was read at
// (optimistic concurrency), or a Create when there is none; losing either
// race is castate.ErrConflict, and nothing is written. Before every write the
// leader fence is checked: a replica that does not lead never writes.
// State that does not parse or check out is refused with
// castate.ErrCorruptState and left as it is for an operator to look at.
//
//	store, err := kubestore.New(kubestore.Config{Client: cs, Namespace: ns, Leader: elector})
//	a, err := ca.New(ca.Config{TrustDomain: td, Backend: store, Leader: elector})
//	go store.Watch(ctx, a.Recheck) // followers reload as soon as the leader writes
package kubestore
