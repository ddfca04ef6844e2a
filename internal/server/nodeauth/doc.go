// Package nodeauth decides whether a node proxy (Istio's ztunnel) may
// obtain a certificate for another workload: Istio's ImpersonatedIdentity,
// which ztunnel sends to get the certificates of the pods on its node. It
// makes the checks istiod's node authorizer makes, against the Kubernetes
// API through a pod informer (the cache is the informer's, so a pod that
// leaves a node stops being impersonable as soon as its deletion is seen):
//
//  1. the caller authenticated with a service account token of one of the
//     trusted node accounts (default istio-system/ztunnel), bound to a pod;
//  2. that pod, with the UID the token was bound to, runs on node N;
//  3. the impersonated identity is spiffe://<td>/ns/<ns>/sa/<sa> of this
//     trust domain, and a pod of that service account runs on node N.
//
// Anything else is refused; an informer not synced yet, or a caller pod it
// has not seen yet, is refused as unavailable so the caller retries.
//
//	a, err := nodeauth.New(nodeauth.Config{Client: client, TrustDomain: td})
//	go a.Run(ctx)
//	err = a.AuthorizeImpersonation(ctx, caller, target)
//
// Outside Kubernetes no informer can vouch for a node, so a node agent on
// a VM may act only for the identities an operator listed for it
// (ParseListed, from the server's --ca-node-agent): exact SPIFFE IDs or
// prefixes of this trust domain. Either combines the two, a listed agent
// being decided by its list alone.
package nodeauth
