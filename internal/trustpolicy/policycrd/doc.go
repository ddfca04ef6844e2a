// Package policycrd is the Kubernetes side of trust policies: the
// ClusterTrustPolicy resource (trustbridge.dev/v1alpha1, cluster-scoped,
// deploy/base/trustpolicy-crd.yaml), whose spec is one trust policy rule
// named after the resource, and the service account labels that rules'
// label selectors read.
package policycrd
