package kubecsr_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net/url"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/upstream/kubecsr"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// TestBuiltinSignerNotAnIntermediate shows, with Kubernetes' own signer
// (kube-controller-manager's CSR signing controller) against the real API
// server, why kube-csr refuses kubernetes.io/* signers: what they issue
// is never a CA certificate, so it cannot become our intermediate.
// kubecsr.New refuses the signer name, so the test creates, approves and
// waits for the CSR itself, then hands the issued certificate to
// ca.CheckUpstreamChain with the cluster signing CA as root.
func TestBuiltinSignerNotAnIntermediate(t *testing.T) {
	env := kubetest.Shared(t)
	kcm := env.CSRSigner(t)
	td := spiffeid.RequireTrustDomainFromString("region.example")
	_, err := kubecsr.New(kubecsr.Config{Client: env.Client, SignerName: certv1.KubeAPIServerClientSignerName, TrustDomain: td.Name(), Roots: []*x509.Certificate{kcm.SigningCA}, Timeout: time.Minute})
	require.Error(t, err, "kube-csr refuses Kubernetes' built-in signers by name")

	key := testca.NewKey(t, testca.ECP256)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "trustbridge"}, URIs: []*url.URL{td.ID().URL()},
	}, key)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	csrs := env.Client.CertificatesV1().CertificateSigningRequests()
	obj := &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "trustbridge-builtin-"},
		Spec: certv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: "kubernetes.io/legacy-unknown",
			Usages:     []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth},
		},
	}
	_, err = csrs.Create(ctx, obj, metav1.CreateOptions{})
	require.True(t, apierrors.IsInvalid(err), "certificates.k8s.io/v1 refuses new legacy-unknown CSRs: %v", err)

	obj.Spec.SignerName = certv1.KubeAPIServerClientSignerName
	obj, err = csrs.Create(ctx, obj, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = csrs.Delete(context.Background(), obj.Name, metav1.DeleteOptions{}) })
	obj.Status.Conditions = append(obj.Status.Conditions, certv1.CertificateSigningRequestCondition{
		Type: certv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "TestApprover", Message: "approved by the test",
	})
	obj, err = csrs.UpdateApproval(ctx, obj.Name, obj, metav1.UpdateOptions{})
	require.NoError(t, err)

	issued := waitIssued(ctx, t, env, kcm, obj)
	require.Len(t, issued, 1)
	assert.False(t, issued[0].IsCA, "a built-in signer never issues a CA certificate")
	require.NoError(t, issued[0].CheckSignatureFrom(kcm.SigningCA), "signed by the cluster signing CA")

	err = ca.CheckUpstreamChain(time.Now(), td, key.Public(), "kubernetes CSR signer "+certv1.KubeAPIServerClientSignerName,
		&ca.UpstreamChain{Chain: issued, Roots: []*x509.Certificate{kcm.SigningCA}})
	require.ErrorIs(t, err, ca.ErrInvalidUpstreamChain)
	assert.Contains(t, err.Error(), "is not a CA certificate")
}

// waitIssued watches obj until kube-controller-manager writes its
// certificate, and returns it; it fails the test if the CSR is denied or
// fails, the controller manager exits, or ctx ends first.
func waitIssued(ctx context.Context, t *testing.T, env *kubetest.Env, kcm *kubetest.CSRSigner, obj *certv1.CertificateSigningRequest) []*x509.Certificate {
	t.Helper()
	w, err := env.Client.CertificatesV1().CertificateSigningRequests().Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", obj.Name).String(), ResourceVersion: obj.ResourceVersion,
	})
	require.NoError(t, err)
	defer w.Stop()
	for {
		if len(obj.Status.Certificate) > 0 {
			certs, err := kubecsr.ParseCertificates(obj.Status.Certificate)
			require.NoError(t, err)
			return certs
		}
		for _, c := range obj.Status.Conditions {
			require.NotContains(t, []certv1.RequestConditionType{certv1.CertificateDenied, certv1.CertificateFailed}, c.Type, "CSR %s: %s", obj.Name, c.Message)
		}
		select {
		case <-kcm.Exited:
			t.Fatalf("kube-controller-manager exited before signing %s; its log is %s", obj.Name, kcm.Log)
		case <-ctx.Done():
			t.Fatalf("kube-controller-manager did not sign %s: %v", obj.Name, ctx.Err())
		case ev, ok := <-w.ResultChan():
			require.True(t, ok, "watch of CSR %s closed", obj.Name)
			if o, isCSR := ev.Object.(*certv1.CertificateSigningRequest); isCSR {
				obj = o
			}
		}
	}
}
