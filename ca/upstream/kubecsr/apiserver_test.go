package kubecsr_test

import (
	"go.uber.org/goleak"

	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/catest"
	"github.com/trustbridge/trustbridge/ca/upstream/kubecsr"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(kubetest.Tests(m)) }

// testSigner stands in, against the real API server, for a PKI's signer
// of signerName: it approves each new CSR of its signer and writes a CA
// certificate for the CSR's key, for spiffe://<td>, into its status; deny
// denies instead. It is the approver/signer of our own the test tier uses
// (kube-controller-manager's built-in signers never issue CA
// certificates).
func testSigner(t *testing.T, client kubernetes.Interface, signer, td string, upstream *testca.CA, deny bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	csrs := client.CertificatesV1().CertificateSigningRequests()
	// List, then watch from the list's version: no CSR created meanwhile
	// is missed.
	list, err := csrs.List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	w, err := csrs.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	require.NoError(t, err)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); w.Stop(); <-done })
	handle := func(csr *certv1.CertificateSigningRequest) {
		if csr.Spec.SignerName != signer || len(csr.Status.Conditions) > 0 {
			return
		}
		if err := approveAndSign(ctx, client, csr, td, upstream, deny); err != nil {
			t.Logf("test signer: %s: %v", csr.Name, err)
		}
	}
	go func() {
		defer close(done)
		for i := range list.Items {
			handle(&list.Items[i])
		}
		for ev := range w.ResultChan() {
			if csr, ok := ev.Object.(*certv1.CertificateSigningRequest); ok {
				handle(csr)
			}
		}
	}()
}

// approveAndSign approves csr (or denies it) and writes a CA certificate
// for its key, for spiffe://<td>, signed by upstream, into its status.
func approveAndSign(ctx context.Context, client kubernetes.Interface, csr *certv1.CertificateSigningRequest, td string, upstream *testca.CA, deny bool) error {
	cond := certv1.CertificateSigningRequestCondition{Type: certv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "TestApprover", Message: "approved by the test"}
	if deny {
		cond.Type, cond.Reason, cond.Message = certv1.CertificateDenied, "TestPolicy", "not an allowed requester"
	}
	csr.Status.Conditions = append(csr.Status.Conditions, cond)
	csrs := client.CertificatesV1().CertificateSigningRequests()
	csr, err := csrs.UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{})
	if err != nil || deny {
		return err
	}
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil {
		return errors.New("request is not PEM")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: "intermediate"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Duration(*csr.Spec.ExpirationSeconds) * time.Second),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		URIs:     []*url.URL{spiffeid.RequireTrustDomainFromString(td).ID().URL()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, upstream.Cert, req.PublicKey, upstream.Key)
	if err != nil {
		return err
	}
	csr.Status.Certificate = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	_, err = csrs.UpdateStatus(ctx, csr, metav1.UpdateOptions{})
	return err
}

// TestAPIServerUpstream runs the kube-csr upstream against a real
// kube-apiserver: an Authority in upstream mode gets its intermediate
// through a CertificateSigningRequest, publishes the signer's root, signs
// leaves that verify against it, and leaves no CSR object behind; a
// certificate for another trust domain and a denial are refused.
func TestAPIServerUpstream(t *testing.T) {
	env := kubetest.Shared(t)
	const td, signer = "region.example", "example.com/trustbridge-intermediate"
	upstream := testca.New(t, "corp.example", testca.Options{NotAfter: time.Now().Add(365 * 24 * time.Hour)})
	client, err := kubecsr.New(kubecsr.Config{Client: env.Client, SignerName: signer, TrustDomain: td, Roots: []*x509.Certificate{upstream.Cert}, Timeout: time.Minute})
	require.NoError(t, err)

	t.Run("intermediate", func(t *testing.T) {
		testSigner(t, env.Client, signer, td, upstream, false)
		a, err := ca.New(ca.Config{TrustDomain: spiffeid.RequireTrustDomainFromString(td), DataDir: t.TempDir(),
			Registerer: prometheus.NewRegistry(), Upstream: client, UpstreamTTL: 2 * time.Hour, MaxWorkloadTTL: time.Hour})
		require.NoError(t, err)
		require.NoError(t, a.Ready())
		assert.Equal(t, []*x509.Certificate{upstream.Cert}, a.Bundle().X509Authorities(), "the signer's root, never the intermediate")

		catest.SignLeaf(t, a, spiffeid.RequireFromString("spiffe://region.example/w"), time.Now())

		list, err := env.Client.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
		require.NoError(t, err)
		for _, o := range list.Items {
			assert.NotEqual(t, signer, o.Spec.SignerName, "CSR %s left behind", o.Name)
		}
	})
	t.Run("chain", func(t *testing.T) {
		testSigner(t, env.Client, signer, td, upstream, false)
		key := testca.NewKey(t, testca.ECP256)
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{spiffeid.RequireTrustDomainFromString(td).ID().URL()}}, key)
		require.NoError(t, err)
		chain, err := client.SignIntermediate(context.Background(), der, time.Hour)
		require.NoError(t, err)
		require.NoError(t, ca.CheckUpstreamChain(time.Now(), spiffeid.RequireTrustDomainFromString(td), key.Public(), client.String(), chain))
		assert.Equal(t, []*x509.Certificate{upstream.Cert}, chain.Roots)
		list, err := env.Client.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
		require.NoError(t, err)
		for _, o := range list.Items {
			assert.NotEqual(t, signer, o.Spec.SignerName, "CSR %s left behind", o.Name)
		}
	})
	t.Run("another trust domain", func(t *testing.T) {
		testSigner(t, env.Client, signer, "corp.example", upstream, false)
		key := testca.NewKey(t, testca.ECP256)
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{spiffeid.RequireTrustDomainFromString(td).ID().URL()}}, key)
		require.NoError(t, err)
		chain, err := client.SignIntermediate(context.Background(), der, time.Hour)
		require.NoError(t, err, "the client returns what was signed; the CA checks it")
		err = ca.CheckUpstreamChain(time.Now(), spiffeid.RequireTrustDomainFromString(td), key.Public(), client.String(), chain)
		require.ErrorIs(t, err, ca.ErrInvalidUpstreamChain)
		assert.Contains(t, err.Error(), "corp.example")
	})
	t.Run("denied", func(t *testing.T) {
		testSigner(t, env.Client, signer, td, upstream, true)
		key := testca.NewKey(t, testca.ECP256)
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{spiffeid.RequireTrustDomainFromString(td).ID().URL()}}, key)
		require.NoError(t, err)
		_, err = client.SignIntermediate(context.Background(), der, time.Hour)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "not an allowed requester")
	})
}
