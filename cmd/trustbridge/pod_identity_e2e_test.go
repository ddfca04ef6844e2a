package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/trustbridge/trustbridge/federation/crd"
	"github.com/trustbridge/trustbridge/federation/distribution"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// TestKubePodIdentityE2E: with --cluster-trust-bundle-signer the leader
// keeps a ClusterTrustBundle of its own roots and one of each federated
// trust domain's, which a pod selects by our signer name and the trust
// domain label; a peer added at run time appears, and disappears when it
// is removed. With --pod-certificate-signer it signs the
// PodCertificateRequests of the enabled namespaces' pods, audited.
func TestKubePodIdentityE2E(t *testing.T) {
	env := kubetest.Shared(t)
	servertest.InstallCRD(t, env)
	dyn := servertest.DynamicClient(t, env)
	eastData, eastRoots := bootstrapDataDir(t, "east.example")
	east := startE2EServer(t, "east.example", eastData, nil)
	eastPEM := writeTemp(t, mustCLI(t, "bundle", "show", "-o", "pem", "--data-dir", eastData))

	westData := t.TempDir()
	signer := "e2e.trustbridge.test/svid"
	o := baseServerOptions("west.example", westData)
	o.GRPC.Kubeconfig = servertest.WriteKubeconfig(t, env.Config.Host, env)
	o.Kube = fastKubeStorage(env.Namespace(t))
	o.Kube.FederationCRD, o.Kube.FederationClass = true, "ctb-e2e"
	o.Kube.TrustBundleSigner = signer
	o.Kube.PodCertSigner, o.Kube.PodCertNamespaces = signer, "pod-identity-e2e=on"
	o.Federation.AllowPrivate = true
	admin, _, _ := launchServer(t, o)
	west := "http://" + admin
	t.Cleanup(func() {
		_ = dyn.Resource(crd.GVR).Delete(context.Background(), "east.example", metav1.DeleteOptions{})
		_ = env.Client.CertificatesV1beta1().ClusterTrustBundles().DeleteCollection(context.Background(), metav1.DeleteOptions{},
			metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.signerName", signer).String()})
	})

	parseRoots := func(c require.TestingT, s string) []*x509.Certificate {
		var roots []*x509.Certificate
		rest := []byte(s)
		for {
			var block *pem.Block
			if block, rest = pem.Decode(rest); block == nil {
				return roots
			}
			cert, err := x509.ParseCertificate(block.Bytes)
			require.NoError(c, err)
			roots = append(roots, cert)
		}
	}
	podView := func(c *assert.CollectT, td string) []*x509.Certificate {
		l, err := env.Client.CertificatesV1beta1().ClusterTrustBundles().List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.signerName", signer).String(),
			LabelSelector: labels.SelectorFromSet(labels.Set{distribution.TrustDomainLabel: td}).String(),
		})
		require.NoError(c, err)
		var roots []*x509.Certificate
		for _, b := range l.Items {
			roots = append(roots, parseRoots(c, b.Spec.TrustBundle)...)
		}
		return roots
	}
	holds := func(td string, want []*x509.Certificate) {
		t.Helper()
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			got := podView(c, td)
			require.Len(c, got, len(want), "roots of %s", td)
			for i := range want {
				assert.True(c, slices.ContainsFunc(got, want[i].Equal), "root %d of %s", i, td)
			}
		}, 30*time.Second, 100*time.Millisecond)
	}
	// With --storage kube the CA is the Secret's, made at this start.
	westRoots := parseRoots(t, mustCLI(t, "bundle", "show", "-o", "pem", "--admin", west))
	require.NotEmpty(t, westRoots)
	holds("west.example", westRoots)
	code, body := servertest.Get(t, west+"/v1/snapshot")
	require.Equal(t, http.StatusOK, code, body)
	var snap api.Snapshot
	require.NoError(t, json.Unmarshal([]byte(body), &snap))
	require.NotNil(t, snap.ClusterTrustBundles, "the leader's snapshot shows its ClusterTrustBundles")
	assert.Equal(t, signer, snap.ClusterTrustBundles.Signer)
	assert.Empty(t, snap.ClusterTrustBundles.Skipped)

	_, stderr, code := runCLIAt(t, time.Now, "", "federation", "add", "east.example", east.bundleURL,
		"--endpoint-spiffe-id", "spiffe://east.example/trustbridge/bundle-endpoint", "--bundle", eastPEM, "--admin", west, "--data-dir", westData)
	require.Equal(t, 0, code, stderr)
	holds("east.example", eastRoots)

	_, stderr, code = runCLIAt(t, time.Now, "", "federation", "remove", "east.example", "--admin", west, "--data-dir", westData)
	require.Equal(t, 0, code, stderr)
	holds("east.example", nil)
	holds("west.example", westRoots)

	t.Run("pod certificates", func(t *testing.T) {
		enabled, closed := env.Namespace(t), env.Namespace(t)
		label(t, env, enabled, "pod-identity-e2e", "on")
		node := createNode(t, env)
		issued := createPodCertificateRequest(t, env, node, enabled, signer)
		bundle := x509bundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString("west.example"), westRoots)
		id, _, err := x509svid.ParseAndVerify(pemBlocks(t, issued.Status.CertificateChain), bundle)
		require.NoError(t, err, "the pod's chain verifies against west's bundle")
		assert.Equal(t, "spiffe://west.example/ns/"+enabled+"/sa/default", id.String())

		denied := createPodCertificateRequest(t, env, node, closed, signer)
		c := denied.Status.Conditions[len(denied.Status.Conditions)-1]
		assert.Equal(t, "Denied", c.Type)
		assert.Equal(t, "NamespaceNotEnabled", c.Reason)

		var events []string
		for _, e := range servertest.ReadAuditLog(t, westData) {
			if strings.HasPrefix(e.Event, "pod_certificate_") {
				events = append(events, e.Event+": "+e.Reason)
			}
		}
		require.Len(t, events, 2)
		assert.Contains(t, events[0], "pod_certificate_issued: X509-SVID "+id.String())
		assert.Contains(t, events[1], "pod_certificate_denied: pod "+closed+"/")
		assert.Contains(t, events[1], "NamespaceNotEnabled")
	})
}

func label(t *testing.T, env *kubetest.Env, ns, key, value string) {
	t.Helper()
	n, err := env.Client.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
	require.NoError(t, err)
	n.Labels[key] = value
	_, err = env.Client.CoreV1().Namespaces().Update(context.Background(), n, metav1.UpdateOptions{})
	require.NoError(t, err)
}

func createNode(t *testing.T, env *kubetest.Env) *corev1.Node {
	t.Helper()
	node, err := env.Client.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{GenerateName: "pod-identity-e2e-"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = env.Client.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{})
	})
	return node
}

// createPodCertificateRequest makes a pod of ns's default service account
// on node with a podCertificate volume of signer, asks for its
// certificate as its kubelet would, and returns the request once decided.
func createPodCertificateRequest(t *testing.T, env *kubetest.Env, node *corev1.Node, ns, signer string) *certv1beta1.PodCertificateRequest {
	t.Helper()
	ctx := context.Background()
	var sa *corev1.ServiceAccount
	require.EventuallyWithT(t, func(c *assert.CollectT) { // made by the namespace's controller, or here
		var err error
		sa, err = env.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			sa, err = env.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
		}
		require.NoError(c, err)
	}, 10*time.Second, 100*time.Millisecond)
	pod, err := env.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec: corev1.PodSpec{NodeName: node.Name, ServiceAccountName: "default",
			Containers: []corev1.Container{{Name: "app", Image: "app:1"}},
			Volumes: []corev1.Volume{{Name: "svid", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{PodCertificate: &corev1.PodCertificateProjection{
					SignerName: signer, KeyType: "ECDSAP256", CredentialBundlePath: "credentials.pem"}}}}}}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	require.NoError(t, err)
	sum := sha256.Sum256([]byte(pod.UID))
	proof, err := ecdsa.SignASN1(rand.Reader, key, sum[:])
	require.NoError(t, err)
	pcrs := env.Client.CertificatesV1beta1().PodCertificateRequests(ns)
	req, err := pcrs.Create(ctx, &certv1beta1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "app-svid"},
		Spec: certv1beta1.PodCertificateRequestSpec{SignerName: signer, PodName: pod.Name, PodUID: pod.UID,
			ServiceAccountName: sa.Name, ServiceAccountUID: sa.UID, NodeName: types.NodeName(node.Name), NodeUID: node.UID,
			PKIXPublicKey: der, ProofOfPossession: proof},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		req, err = pcrs.Get(ctx, req.Name, metav1.GetOptions{})
		require.NoError(c, err)
		assert.NotEmpty(c, req.Status.Conditions, "not decided yet")
	}, 30*time.Second, 100*time.Millisecond)
	return req
}

func pemBlocks(t *testing.T, s string) [][]byte {
	t.Helper()
	var out [][]byte
	rest := []byte(s)
	for {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			return out
		}
		out = append(out, block.Bytes)
	}
}
