package helmtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// How long the API server may take to load a new admission policy, and
// how often to probe for it (federation/distribution's TestKubeRBAC waits
// the same way: the API server signals nothing when a policy is in force).
const (
	policyWait = 20 * time.Second
	policyTick = 20 * time.Millisecond
)

func randomName(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// installRBAC renders a release of a fresh name into a fresh namespace,
// applies its service account, RBAC and admission policy to the API server
// tier, and returns a client acting as that service account, the
// namespace and the release's full name.
func installRBAC(t *testing.T, env *kubetest.Env, values map[string]any) (kubernetes.Interface, string, string) {
	t.Helper()
	ns := env.Namespace(t)
	release := randomName("r")
	out, err := renderIn(t, release, ns, kubeCapabilities(), values)
	require.NoError(t, err)
	var objs []runtime.Object
	for _, o := range kubetest.DecodeObjects(t, out) {
		switch o.GetKind() {
		case "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
			"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			if o.GetNamespace() != "" && o.GetNamespace() != ns {
				continue // the events Role in default
			}
			data, err := o.MarshalJSON()
			require.NoError(t, err)
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
			require.NoError(t, err)
			objs = append(objs, obj)
		}
	}
	env.Apply(t, nil, objs)
	full := release + "-trustbridge"
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + full}
	sa, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	return sa, ns, full
}

// The chart's RBAC and admission policy, installed as a release of
// another name in another namespace, let its service account write the
// federated bundles and the trust ConfigMap and nothing else: never the
// release's own config ConfigMap. pods are readable only with
// impersonation on.
func TestChartRBACLive(t *testing.T) {
	env := kubetest.Shared(t)
	ctx := context.Background()
	v := baseValues()
	delete(v, "namespace")
	sa, ns, full := installRBAC(t, env, v)
	cm := func(ns, name string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string]string{"k": "v"}}
	}

	_, err := sa.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	assert.NoError(t, err, "node proxies' pods")

	// The policy takes effect once the API server has loaded it: probe
	// with fresh names until a create it forbids is refused.
	other := env.Namespace(t)
	var last error
	refused := assert.Eventually(t, func() bool {
		_, last = sa.CoreV1().ConfigMaps(other).Create(ctx, cm(other, randomName("app-")), metav1.CreateOptions{})
		return apierrors.IsForbidden(last)
	}, policyWait, policyTick)
	require.True(t, refused, "create of another ConfigMap elsewhere: last got %v", last)
	assert.ErrorContains(t, last, "trustbridge may write only its trust ConfigMap")

	own, err := env.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm(ns, full+"-config"), metav1.CreateOptions{})
	require.NoError(t, err)
	own.Data["k"] = "evil"
	_, err = sa.CoreV1().ConfigMaps(ns).Update(ctx, own, metav1.UpdateOptions{})
	assert.True(t, apierrors.IsForbidden(err), "update its own config: got %v", err)
	err = sa.CoreV1().ConfigMaps(ns).Delete(ctx, own.Name, metav1.DeleteOptions{})
	assert.True(t, apierrors.IsForbidden(err), "delete its own config: got %v", err)

	lkg, err := sa.CoreV1().ConfigMaps(ns).Create(ctx, cm(ns, randomName("trustbridge-lkg-")), metav1.CreateOptions{})
	require.NoError(t, err, "a federated bundle")
	lkg.Data["k"] = "v2"
	_, err = sa.CoreV1().ConfigMaps(ns).Update(ctx, lkg, metav1.UpdateOptions{})
	assert.NoError(t, err, "update a federated bundle")
	assert.NoError(t, sa.CoreV1().ConfigMaps(ns).Delete(ctx, lkg.Name, metav1.DeleteOptions{}), "delete a federated bundle")
	_, err = sa.CoreV1().ConfigMaps(other).Create(ctx, cm(other, "trustbridge-ca-root-cert"), metav1.CreateOptions{})
	assert.NoError(t, err, "the trust ConfigMap in another namespace")

	v = baseValues()
	delete(v, "namespace")
	v["policy"] = map[string]any{"caTrustedNodeAccounts": []any{}}
	noImpersonation, _, _ := installRBAC(t, env, v)
	_, err = noImpersonation.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	assert.True(t, apierrors.IsForbidden(err), "no impersonation, no pods: got %v", err)
}

// With distribution.rootSecret, the chart's service account may write
// that Secret in any namespace and no other Secret outside its own
// namespace; without it, it may create no Secret elsewhere at all.
func TestChartRBACLiveRootSecret(t *testing.T) {
	env := kubetest.Shared(t)
	ctx := context.Background()
	secret := func(ns, name string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, StringData: map[string]string{"k": "v"}}
	}
	other := env.Namespace(t)

	v := baseValues()
	delete(v, "namespace")
	without, _, _ := installRBAC(t, env, v)
	_, err := without.CoreV1().Secrets(other).Create(ctx, secret(other, "trustbridge-roots"), metav1.CreateOptions{})
	assert.True(t, apierrors.IsForbidden(err), "no rootSecret, no Secret elsewhere: got %v", err)

	v = baseValues()
	delete(v, "namespace")
	v["distribution"] = map[string]any{"rootSecret": "trustbridge-roots"}
	sa, ns, _ := installRBAC(t, env, v)
	var last error
	refused := assert.Eventually(t, func() bool {
		_, last = sa.CoreV1().Secrets(other).Create(ctx, secret(other, randomName("app-")), metav1.CreateOptions{})
		return apierrors.IsForbidden(last)
	}, policyWait, policyTick)
	require.True(t, refused, "create of another Secret elsewhere: last got %v", last)
	assert.ErrorContains(t, last, "trustbridge may write only its distributed trust Secret")

	s, err := sa.CoreV1().Secrets(other).Create(ctx, secret(other, "trustbridge-roots"), metav1.CreateOptions{})
	require.NoError(t, err, "the distributed Secret")
	s.StringData = map[string]string{"k": "v2"}
	_, err = sa.CoreV1().Secrets(other).Update(ctx, s, metav1.UpdateOptions{})
	assert.NoError(t, err, "update the distributed Secret")
	_, err = sa.CoreV1().Secrets(other).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=trustbridge-roots"})
	assert.NoError(t, err, "list the distributed Secret by name")
	assert.NoError(t, sa.CoreV1().Secrets(other).Delete(ctx, "trustbridge-roots", metav1.DeleteOptions{}), "delete the distributed Secret")
	_, err = sa.CoreV1().Secrets(other).List(ctx, metav1.ListOptions{})
	assert.True(t, apierrors.IsForbidden(err), "list every Secret: got %v", err)
	_, err = sa.CoreV1().Secrets(ns).Create(ctx, secret(ns, "trustbridge-ca"), metav1.CreateOptions{})
	assert.NoError(t, err, "its CA Secret in its own namespace")
}

// podIdentityValues enable both pod identity features under signer, as
// a release installed by installRBAC (no Namespace of its own).
func podIdentityValues(signer string, podCerts bool) map[string]any {
	v := baseValues()
	delete(v, "namespace")
	pc := map[string]any{"enabled": podCerts}
	if podCerts {
		pc["namespaces"] = "kubernetes.io/metadata.name"
	}
	v["podIdentity"] = map[string]any{"signerName": signer, "podCertificates": pc, "clusterTrustBundles": map[string]any{"enabled": true}}
	return v
}

// allowed asks the API server's authorizer whether user may verb the
// signer name.
func allowed(t *testing.T, env *kubetest.Env, user, verb, signer string) bool {
	t.Helper()
	review, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &authorizationv1.ResourceAttributes{
			Group: "certificates.k8s.io", Resource: "signers", Verb: verb, Name: signer,
		}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	return review.Status.Allowed
}

// podCertificateRequest is a request a kubelet could make for a pod of
// ns, with a fresh key and its proof of possession (the API server checks
// both before admission).
func podCertificateRequest(t *testing.T, ns, signer string) *certv1beta1.PodCertificateRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	require.NoError(t, err)
	podUID := types.UID("11111111-2222-3333-4444-555555555555")
	sum := sha256.Sum256([]byte(podUID))
	proof, err := ecdsa.SignASN1(rand.Reader, key, sum[:])
	require.NoError(t, err)
	maxSeconds := int32(86400)
	return &certv1beta1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "app-"},
		Spec: certv1beta1.PodCertificateRequestSpec{
			SignerName: signer, PodName: "app", PodUID: podUID,
			ServiceAccountName: "app", ServiceAccountUID: "22222222-3333-4444-5555-666666666666",
			NodeName: "node-1", NodeUID: "33333333-4444-5555-6666-777777777777",
			MaxExpirationSeconds: &maxSeconds, PKIXPublicKey: der, ProofOfPossession: proof,
		},
	}
}

// clusterTrustBundle is a bundle of one fresh root linked to signer.
func clusterTrustBundle(t *testing.T, signer string) *certv1beta1.ClusterTrustBundle {
	t.Helper()
	root := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: testRoot(t, "bundle test root").Raw})
	return &certv1beta1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: strings.ReplaceAll(signer, "/", ":") + ":" + randomName("td-")},
		Spec:       certv1beta1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: string(root)},
	}
}

// podIdentity's ClusterRole and admission policy on the API server: the
// service account may sign for and attest to its signer and no other (the
// API server's own checks of a status write and a linked bundle's create
// say so, not only the authorizer), and a PodCertificateRequest for the
// signer from anyone but the node's kubelet is refused. Without pod
// certificates, no sign and no request access.
func TestChartRBACLivePodIdentity(t *testing.T) {
	env := kubetest.Shared(t)
	ctx := context.Background()
	signer := randomName("r") + ".trustbridge.test/svid"
	other := randomName("o") + ".trustbridge.test/svid"
	sa, ns, full := installRBAC(t, env, podIdentityValues(signer, true))
	user := "system:serviceaccount:" + ns + ":" + full
	assert.True(t, allowed(t, env, user, "sign", signer))
	assert.True(t, allowed(t, env, user, "attest", signer))
	assert.False(t, allowed(t, env, user, "sign", other), "sign pinned to the signer's name")
	assert.False(t, allowed(t, env, user, "attest", other), "attest pinned to the signer's name")

	_, err := sa.CertificatesV1beta1().PodCertificateRequests("").List(ctx, metav1.ListOptions{FieldSelector: "spec.signerName=" + signer})
	assert.NoError(t, err, "watch the signer's requests")
	for _, get := range []func() error{
		func() error { _, err := sa.CoreV1().Pods(ns).Get(ctx, "absent", metav1.GetOptions{}); return err },
		func() error { _, err := sa.CoreV1().Nodes().Get(ctx, "absent", metav1.GetOptions{}); return err },
		func() error { _, err := sa.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); return err },
	} {
		err := get()
		assert.False(t, apierrors.IsForbidden(err), "read the pod, node and namespace a request names: got %v", err)
	}

	bundle, err := sa.CertificatesV1beta1().ClusterTrustBundles().Create(ctx, clusterTrustBundle(t, signer), metav1.CreateOptions{})
	require.NoError(t, err, "a bundle linked to its signer")
	assert.NoError(t, sa.CertificatesV1beta1().ClusterTrustBundles().Delete(ctx, bundle.Name, metav1.DeleteOptions{}))
	_, err = sa.CertificatesV1beta1().ClusterTrustBundles().Create(ctx, clusterTrustBundle(t, other), metav1.CreateOptions{})
	assert.True(t, apierrors.IsForbidden(err), "a bundle linked to another signer: got %v", err)

	// Another signer's request, which the policy lets the admin create:
	// the service account may not decide it.
	foreign, err := env.Client.CertificatesV1beta1().PodCertificateRequests(ns).Create(ctx, podCertificateRequest(t, ns, other), metav1.CreateOptions{})
	require.NoError(t, err)
	foreign.Status.Conditions = []metav1.Condition{{Type: certv1beta1.PodCertificateRequestConditionTypeDenied, Status: metav1.ConditionTrue,
		Reason: "Test", Message: "m", LastTransitionTime: metav1.Now()}}
	_, err = sa.CertificatesV1beta1().PodCertificateRequests(ns).UpdateStatus(ctx, foreign, metav1.UpdateOptions{})
	assert.ErrorContains(t, err, `is not permitted to "sign" for signer "`+other+`"`)

	// Ours, asked by the cluster admin rather than the node's kubelet.
	var last error
	refused := assert.Eventually(t, func() bool {
		_, last = env.Client.CertificatesV1beta1().PodCertificateRequests(ns).Create(ctx, podCertificateRequest(t, ns, signer), metav1.CreateOptions{})
		return apierrors.IsForbidden(last)
	}, policyWait, policyTick)
	require.True(t, refused, "a request for the signer not from the node's kubelet: last got %v", last)
	assert.ErrorContains(t, last, "only the kubelet of the node a PodCertificateRequest names may ask signer "+signer)

	bundleSigner := randomName("b") + ".trustbridge.test/svid"
	bundlesOnly, ns, full := installRBAC(t, env, podIdentityValues(bundleSigner, false))
	user = "system:serviceaccount:" + ns + ":" + full
	assert.True(t, allowed(t, env, user, "attest", bundleSigner))
	assert.False(t, allowed(t, env, user, "sign", bundleSigner), "no pod certificates, no sign")
	_, err = bundlesOnly.CertificatesV1beta1().PodCertificateRequests("").List(ctx, metav1.ListOptions{})
	assert.True(t, apierrors.IsForbidden(err), "no pod certificates, no requests: got %v", err)
}
