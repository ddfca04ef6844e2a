// Package podcert makes trustbridge a signer of Kubernetes
// PodCertificateRequests (certificates.k8s.io/v1beta1, KEP-4317): the
// kubelet generates a key for a pod whose spec holds a podCertificate
// projected volume naming the signer, asks with a PodCertificateRequest,
// and mounts the chain the signer writes into the request's status. No
// agent, CSI driver or sidecar is involved.
//
// A Signer issues the pod an X509-SVID of its service account,
// spiffe://<trust domain>/ns/<namespace>/sa/<service account>, as Istio
// names workloads. It does not take the request's word for anything it can
// check: NodeRestriction checks the pod, node and service account only
// when a kubelet creates the request, and nothing at all for another user
// allowed to create requests, so the signer reads the pod, node and
// service account itself, requires the pod to ask for this signer in its
// spec, verifies the proof of possession again, and denies requests from
// namespaces the operator did not enable or carrying
// unverifiedUserAnnotations it does not know.
//
//	s, err := podcert.New(podcert.Config{
//		Client:      client,
//		SignerName:  "trustbridge.io/svid",
//		TrustDomain: td,
//		Authority:   authority, // *ca.Authority
//		Namespaces:  selector,
//	})
//	go s.Run(leaderCtx) // on the leader only
//
// https://github.com/kubernetes/enhancements/tree/master/keps/sig-auth/4317-pod-certificates
package podcert
