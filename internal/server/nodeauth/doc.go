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
// With an identity map (Config.IdentityMap: the server's --identity-map
// and ClusterIdentityMapping resources, the rules the node agent maps its
// workloads with), check 3 becomes: some running pod on node N, with the
// facts the API server has of it (namespace, service account, pod name
// and UID, labels, node; identitymap.ServerFacts), gets exactly the
// impersonated identity from the map: a rule's custom template for the
// pods it selects, the default (the Istio form, or nothing with default
// none) for the pods no rule selects. Rules that select by unix facts
// (uid, gid, binary) or fill templates with the container or the
// caller's uid, gid, user or group cannot be checked here: they never
// select a pod or fail it, so their IDs are never granted to a node
// agent (fail closed; identitymap.Map.AgentOnly lists them). Until the
// map holds every source (Config.MapReady), requests are refused as
// unavailable. Without a map, only the Istio form is granted, as above.
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
