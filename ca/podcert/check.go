package podcert

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	certv1beta1 "k8s.io/api/certificates/v1beta1"
	corev1 "k8s.io/api/core/v1"
)

// Reasons of a Denied or Failed condition, and the outcome label of
// trustbridge_pod_certificates_total besides "issued".
const (
	ReasonUnsupportedKeyType  = certv1beta1.PodCertificateRequestConditionUnsupportedKeyType
	ReasonInvalidAnnotations  = certv1beta1.PodCertificateRequestConditionInvalidUserConfig
	ReasonNamespaceNotEnabled = "NamespaceNotEnabled"
	ReasonBadProof            = "InvalidProofOfPossession"
	ReasonPodMismatch         = "PodMismatch"
	ReasonSignFailed          = "SigningFailed"
	ReasonLifetime            = "LifetimeUnavailable"
)

// refusal is a request the signer will not issue: Denied (the request is
// wrong and asking again will not help) or Failed (the signer could not).
type refusal struct {
	failed  bool
	reason  string
	message string
}

func (r *refusal) Error() string { return r.reason + ": " + r.message }

// maxMessage bounds a condition's message: the API server refuses a
// condition message over 32 KiB, and an error it quotes (a whole chain)
// could pass that.
const maxMessage = 1 << 10

func clip(s string) string {
	if len(s) <= maxMessage {
		return s
	}
	return s[:maxMessage-len("…")] + "…"
}

func deny(reason, format string, args ...any) *refusal {
	return &refusal{reason: reason, message: fmt.Sprintf(format, args...)}
}

// supportedKey parses the request's key and refuses those the CA does not
// sign for: ECDSA P-256 and P-384, RSA 3072 and 4096, as the kubelet
// offers them (Ed25519 and P-521 are denied with a suggestion).
func supportedKey(der []byte) (crypto.PublicKey, *refusal) {
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, deny(ReasonUnsupportedKeyType, "the public key does not parse (%v); use ECDSAP256", err)
	}
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve == elliptic.P256() || k.Curve == elliptic.P384() {
			return pub, nil
		}
		return nil, deny(ReasonUnsupportedKeyType, "ECDSA curve %s is not signed here; use ECDSAP256 or ECDSAP384", k.Curve.Params().Name)
	case *rsa.PublicKey:
		if n := k.N.BitLen(); n == 3072 || n == 4096 {
			return pub, nil
		}
		return nil, deny(ReasonUnsupportedKeyType, "RSA %d is not signed here; use ECDSAP256, or RSA3072", k.N.BitLen())
	case ed25519.PublicKey:
		return nil, deny(ReasonUnsupportedKeyType, "Ed25519 keys are not signed here (X509-SVID peers rarely accept them); use ECDSAP256")
	default:
		return nil, deny(ReasonUnsupportedKeyType, "key type %T is not signed here; use ECDSAP256", pub)
	}
}

// checkProof verifies the proof of possession: the pod UID's ASCII bytes
// signed with the requested key. The API server checks it at creation;
// the signer checks again rather than rely on an admission it cannot see.
func checkProof(pub crypto.PublicKey, podUID string, proof []byte) *refusal {
	msg := []byte(podUID)
	ok := false
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		sum := sha256.Sum256(msg)
		ok = ecdsa.VerifyASN1(k, sum[:], proof)
	case *rsa.PublicKey:
		sum := sha256.Sum256(msg)
		ok = rsa.VerifyPSS(k, crypto.SHA256, sum[:], proof, nil) == nil
	}
	if !ok {
		return deny(ReasonBadProof, "the proof of possession does not verify against the requested key for pod UID %s", podUID)
	}
	return nil
}

// checkPod compares the request with the pod, node and service account as
// they are now. Its messages name what the request claimed, never the
// real UIDs or node: whoever can read a forged request's status must not
// learn them from its denial. NodeRestriction checks these when a kubelet creates the
// request, but nothing checks a request created by anyone else allowed to
// create them: the signer checks for itself, and also that the pod asks
// for a certificate of this signer in its spec, as only such a pod's
// kubelet would.
func checkPod(req *certv1beta1.PodCertificateRequest, pod *corev1.Pod, node *corev1.Node, sa *corev1.ServiceAccount, signer string) *refusal {
	s := req.Spec
	switch {
	case pod == nil:
		return deny(ReasonPodMismatch, "pod %s/%s does not exist", req.Namespace, s.PodName)
	case pod.UID != s.PodUID:
		return deny(ReasonPodMismatch, "pod %s/%s does not have the UID the request names", req.Namespace, s.PodName)
	case pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return deny(ReasonPodMismatch, "pod %s/%s is terminating or has terminated", req.Namespace, s.PodName)
	case pod.Spec.NodeName == "" || pod.Spec.NodeName != string(s.NodeName):
		return deny(ReasonPodMismatch, "pod %s/%s is not bound to node %q, which the request names", req.Namespace, s.PodName, s.NodeName)
	case node == nil || node.UID != s.NodeUID:
		return deny(ReasonPodMismatch, "node %q does not exist or does not have the UID the request names", s.NodeName)
	case pod.Spec.ServiceAccountName != s.ServiceAccountName:
		return deny(ReasonPodMismatch, "pod %s/%s does not run as service account %q, which the request names", req.Namespace, s.PodName, s.ServiceAccountName)
	case sa == nil || sa.UID != s.ServiceAccountUID:
		return deny(ReasonPodMismatch, "service account %s/%s does not exist or does not have the UID the request names", req.Namespace, s.ServiceAccountName)
	case !asksForSigner(pod, signer):
		return deny(ReasonPodMismatch, "pod %s/%s has no podCertificate volume of signer %s: its kubelet would not ask for this certificate", req.Namespace, s.PodName, signer)
	}
	return nil
}

func asksForSigner(pod *corev1.Pod, signer string) bool {
	for _, v := range pod.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			if src.PodCertificate != nil && src.PodCertificate.SignerName == signer {
				return true
			}
		}
	}
	return false
}

// Lifetime bounds of the API: a pod certificate lives at least an hour,
// and the request's maximum defaults to a day.
const (
	minLifetime     = time.Hour
	defaultLifetime = 24 * time.Hour
)

// lifetime is the certificate's lifetime: the request's maximum, clamped
// to the CA's maximum workload lifetime; under the API's hour minimum the
// request fails, saying which flag bounds it.
func lifetime(req *certv1beta1.PodCertificateRequest, caMax time.Duration) (time.Duration, *refusal) {
	want := defaultLifetime
	if m := req.Spec.MaxExpirationSeconds; m != nil {
		want = time.Duration(*m) * time.Second
	}
	if caMax > 0 && want > caMax {
		want = caMax.Truncate(time.Second)
	}
	if want < minLifetime {
		return 0, &refusal{failed: true, reason: ReasonLifetime,
			message: fmt.Sprintf("the CA's maximum workload lifetime (--max-workload-ttl %s) is under the hour a pod certificate must live", caMax)}
	}
	return want, nil
}

var errNoChain = errors.New("the CA returned no certificate")

// caBackdate is how far the CA sets a leaf's NotBefore before now
// (ca/sign.go); checkIssued catches it if that ever grows.
const caBackdate = 10 * time.Second

// checkIssued fails a leaf whose lifetime, as the API server counts it
// (NotAfter - NotBefore), is outside [an hour, max]: shortened by the
// signing chain's own expiry, or longer than asked.
func checkIssued(leaf *x509.Certificate, max time.Duration) *refusal {
	if leaf == nil {
		return &refusal{failed: true, reason: ReasonSignFailed, message: errNoChain.Error()}
	}
	switch life := leaf.NotAfter.Sub(leaf.NotBefore); {
	case life > max:
		return &refusal{failed: true, reason: ReasonLifetime, message: fmt.Sprintf("the CA issued %s, over the %s asked for", life, max)}
	case life < minLifetime:
		return &refusal{failed: true, reason: ReasonLifetime,
			message: fmt.Sprintf("the CA can issue only %s (its signing certificate expires at %s), under the hour a pod certificate must live; rotate the CA", life, leaf.NotAfter.UTC().Format(time.RFC3339))}
	}
	return nil
}
