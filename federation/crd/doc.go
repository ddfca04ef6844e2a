// Package crd turns ClusterFederatedTrustDomain resources
// (trustbridge.dev/v1alpha1, deploy/base/crd.yaml) into federation
// endpoints, and reports each endpoint's polling state in the resource's
// status, so `kubectl get clusterfederatedtrustdomains` answers whom a
// cluster trusts and how fresh that trust is.
//
// The spec takes spire-controller-manager's field names (trustDomain,
// bundleEndpointURL, bundleEndpointProfile{type, endpointSPIFFEID},
// trustDomainBundle, className) plus refresh{min, max}, and is checked by
// the same rules as the federation file (federation.ParseConfig): a
// resource and a file entry mean the same thing. A refused spec gets
// Ready=False with the reason and a Warning event and is never partly
// applied; if an earlier generation was valid, that one stays applied. Of
// two resources for one trust domain the older wins; the other, and any
// resource for a trust domain configured by flag or file, gets
// Ready=False reason Conflict. A server without a class acts on resources
// without className; a server with one acts on those and on its own.
//
//	c, err := crd.New(crd.Config{Dynamic: dyn, Events: client, Apply: applyToPoller, Status: poller.Status})
//	go c.Run(ctx)
//
// Every replica applies the resources, so a new leader polls the same set
// at once; only the leader writes statuses and events.
package crd
