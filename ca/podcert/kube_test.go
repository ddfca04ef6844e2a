package podcert

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(kubetest.Tests(m)) }

const (
	testTD  = "example.org"
	waitFor = 20 * time.Second
	tick    = 20 * time.Millisecond
)

// fakeAuthority signs with a test root through the CA's own signing path.
type fakeAuthority struct {
	m ca.SigningMaterial
	p ca.Policy
}

func (f fakeAuthority) SignX509SVID(p ca.X509SVIDParams) (*ca.Issued, error) {
	return ca.SignX509SVID(time.Now(), f.m, f.p, p)
}
func (f fakeAuthority) MaxWorkloadTTL() time.Duration { return f.p.MaxTTL }

// rig is a Signer on the shared API server with a node, an enabled and a
// disabled namespace, and a kubelet client acting as the node's user.
type rig struct {
	env             *kubetest.Env
	signer          string
	root            *testca.CA
	node            *corev1.Node
	enabled, closed string
	kubelet         kubernetes.Interface
	reg             *prometheus.Registry
	outcomes        chan Outcome
	enableLabel     string
	auth            fakeAuthority
}

func newRig(t *testing.T) *rig {
	t.Helper()
	return newRigAs(t, nil, random("t")+".trustbridge.test/svid")
}

// newRigAs runs the signer with client (nil: the cluster admin) for
// signer.
func newRigAs(t *testing.T, client kubernetes.Interface, signer string) *rig {
	t.Helper()
	return newRigFor(t, client, signer, true)
}

// newRigFor makes the rig, and runs its signer when run is set.
func newRigFor(t testing.TB, client kubernetes.Interface, signer string, run bool) *rig {
	t.Helper()
	env := kubetest.Shared(t)
	if client == nil {
		client = env.Client
	}
	ctx := context.Background()
	r := &rig{env: env, signer: signer, root: testca.New(t, testTD),
		reg: prometheus.NewRegistry(), outcomes: make(chan Outcome, 16)}
	node, err := env.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: random("node-")}}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = env.Client.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{})
	})
	r.node = node
	r.enableLabel = random("on")
	r.enabled, r.closed = env.Namespace(t), env.Namespace(t)
	r.enable(t, r.enabled)
	_, err = env.Client.CoreV1().ServiceAccounts(r.closed).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	r.kubelet = r.nodeClient(t)
	r.auth = fakeAuthority{
		m: ca.SigningMaterial{Cert: r.root.Cert, Key: r.root.Key, Roots: []*x509.Certificate{r.root.Cert}},
		p: ca.Policy{TrustDomain: spiffeid.RequireTrustDomainFromString(testTD), MaxTTL: 12 * time.Hour},
	}
	if !run {
		return r
	}
	s, err := New(Config{
		Client: client, SignerName: r.signer, TrustDomain: spiffeid.RequireTrustDomainFromString(testTD),
		Authority:  r.auth,
		Namespaces: labels.SelectorFromSet(labels.Set{"podcert-test": r.enableLabel}),
		Outcome:    func(o Outcome) { r.outcomes <- o },
		Registerer: r.reg,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return r
}

// enable labels ns for the rig's signer and gives it service account app.
func (r *rig) enable(t testing.TB, ns string) {
	t.Helper()
	ctx := context.Background()
	_, err := r.env.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	n, err := r.env.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	require.NoError(t, err)
	n.Labels["podcert-test"] = r.enableLabel
	_, err = r.env.Client.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// nodeClient acts as the node's kubelet: its user, allowed (by a
// ClusterRole bound here, the node authorizer's grant in a real cluster)
// to create PodCertificateRequests.
func (r *rig) nodeClient(t testing.TB) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	user := "system:node:" + r.node.Name
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: r.node.Name + "-pcr"}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"podcertificaterequests"}, Verbs: []string{"create", "get"},
	}}}
	_, err := r.env.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{})
	require.NoError(t, err)
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: user}}}
	_, err = r.env.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = r.env.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
		_ = r.env.Client.RbacV1().ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{})
	})
	cfg := rest.CopyConfig(r.env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:nodes", "system:authenticated"}}
	c, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	r.env.WaitRBAC(t, role, binding)
	return c
}

// pod creates a pod on the rig's node in ns running as service account
// app, with a podCertificate volume of signer.
func (r *rig) pod(t testing.TB, ns, signer string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: random("pod-")},
		Spec: corev1.PodSpec{
			NodeName: r.node.Name, ServiceAccountName: "app",
			Containers: []corev1.Container{{Name: "app", Image: "app:1",
				VolumeMounts: []corev1.VolumeMount{{Name: "svid", MountPath: "/var/run/svid"}}}},
			Volumes: []corev1.Volume{{Name: "svid", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{PodCertificate: &corev1.PodCertificateProjection{
					SignerName: signer, KeyType: "ECDSAP256", CredentialBundlePath: "credentials.pem",
				}}},
			}}}},
		},
	}
	pod, err := r.env.Client.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{})
	require.NoError(t, err)
	return pod
}

// request creates a PodCertificateRequest as the kubelet would for pod,
// with key and its proof of possession over podUID.
func (r *rig) request(t *testing.T, pod *corev1.Pod, key crypto.Signer, podUID types.UID, maxSeconds int32) (*certv1beta1.PodCertificateRequest, error) {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	require.NoError(t, err)
	var proof []byte
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		sum := sha256.Sum256([]byte(podUID))
		proof, err = ecdsa.SignASN1(rand.Reader, k, sum[:])
	case ed25519.PrivateKey:
		proof = ed25519.Sign(k, []byte(podUID))
	}
	require.NoError(t, err)
	sa, err := r.env.Client.CoreV1().ServiceAccounts(pod.Namespace).Get(context.Background(), "app", metav1.GetOptions{})
	require.NoError(t, err)
	return r.kubelet.CertificatesV1beta1().PodCertificateRequests(pod.Namespace).Create(context.Background(), &certv1beta1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: pod.Name + "-"},
		Spec: certv1beta1.PodCertificateRequestSpec{
			SignerName: r.signer, PodName: pod.Name, PodUID: podUID,
			ServiceAccountName: "app", ServiceAccountUID: sa.UID,
			NodeName: types.NodeName(r.node.Name), NodeUID: r.node.UID,
			MaxExpirationSeconds: &maxSeconds, PKIXPublicKey: der, ProofOfPossession: proof,
		},
	}, metav1.CreateOptions{})
}

// outcome waits for the request's end as the API server holds it.
func (r *rig) outcome(t *testing.T, req *certv1beta1.PodCertificateRequest) *certv1beta1.PodCertificateRequest {
	t.Helper()
	var got *certv1beta1.PodCertificateRequest
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var err error
		got, err = r.env.Client.CertificatesV1beta1().PodCertificateRequests(req.Namespace).Get(context.Background(), req.Name, metav1.GetOptions{})
		require.NoError(c, err)
		assert.True(c, done(got), "no outcome yet")
	}, waitFor, tick)
	return got
}

func condition(req *certv1beta1.PodCertificateRequest) metav1.Condition {
	return req.Status.Conditions[len(req.Status.Conditions)-1]
}

func TestKubeSignsAPodCertificateRequest(t *testing.T) {
	r := newRig(t)
	pod := r.pod(t, r.enabled, r.signer)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	req, err := r.request(t, pod, key, pod.UID, 86400)
	require.NoError(t, err)
	got := r.outcome(t, req)
	c := condition(got)
	require.Equal(t, certv1beta1.PodCertificateRequestConditionTypeIssued, c.Type, c.Message)

	bundle := x509bundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString(testTD), []*x509.Certificate{r.root.Cert})
	id, chains, err := x509svid.ParseAndVerify(pemDERs(t, got.Status.CertificateChain), bundle)
	require.NoError(t, err, "the issued chain verifies with go-spiffe against our bundle")
	assert.Equal(t, "spiffe://"+testTD+"/ns/"+r.enabled+"/sa/app", id.String())
	leaf := chains[0][0]
	assert.True(t, leaf.PublicKey.(*ecdsa.PublicKey).Equal(key.Public()), "issued to the kubelet's key")
	assert.WithinDuration(t, time.Now().Add(12*time.Hour), leaf.NotAfter, time.Minute, "the request's day, clamped to the CA's maximum")
	assert.True(t, got.Status.NotAfter.Time.Equal(leaf.NotAfter))
	assert.True(t, got.Status.NotBefore.Time.Equal(leaf.NotBefore))
	o := <-r.outcomes
	assert.Equal(t, "issued", o.Result)
	assert.Equal(t, id, o.SPIFFEID)

	// The shortest lifetime the API allows, asked for exactly: the CA's
	// backdated NotBefore must not carry it past the request's maximum.
	req, err = r.request(t, pod, key, pod.UID, 3600)
	require.NoError(t, err)
	got = r.outcome(t, req)
	c = condition(got)
	require.Equal(t, certv1beta1.PodCertificateRequestConditionTypeIssued, c.Type, c.Message)
	assert.Equal(t, time.Hour, got.Status.NotAfter.Sub(got.Status.NotBefore.Time))
}

// TestKubeRBAC runs the signer as deploy/rbac's service account with
// deploy/rbac/pod-identity applied: it signs for its signer, and the API
// server refuses it the status of another signer's request.
func TestKubeRBAC(t *testing.T) {
	env := kubetest.Shared(t)
	const ns = "trustbridge-system"
	env.Apply(t, []string{ns}, kubetest.LoadManifests(t, "../../deploy/rbac/pod-identity"))
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":trustbridge"}
	sa, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)

	r := newRigAs(t, sa, "trustbridge.io/svid")
	pod := r.pod(t, r.enabled, r.signer)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)

	// The admission policy: only the kubelet of the node a request names
	// may ask our signer; the cluster admin, say, may not.
	admin := r.kubelet
	r.kubelet = env.Client
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, err := r.request(t, pod, key, pod.UID, 86400)
		assert.ErrorContains(c, err, "only the kubelet of the node a PodCertificateRequest names")
	}, waitFor, 100*time.Millisecond, "the policy takes a moment to be enforced")
	r.kubelet = admin

	req, err := r.request(t, pod, key, pod.UID, 86400)
	require.NoError(t, err)
	c := condition(r.outcome(t, req))
	assert.Equal(t, certv1beta1.PodCertificateRequestConditionTypeIssued, c.Type, c.Message)

	// Another signer's request: the role's sign is pinned to ours.
	other := r.pod(t, r.enabled, "other.trustbridge.test/svid")
	r.signer = "other.trustbridge.test/svid"
	foreign, err := r.request(t, other, key, other.UID, 86400)
	require.NoError(t, err)
	foreign.Status.Conditions = []metav1.Condition{{Type: certv1beta1.PodCertificateRequestConditionTypeDenied, Status: metav1.ConditionTrue,
		Reason: "Test", Message: "m", LastTransitionTime: metav1.Now()}}
	_, err = sa.CertificatesV1beta1().PodCertificateRequests(foreign.Namespace).UpdateStatus(context.Background(), foreign, metav1.UpdateOptions{})
	assert.ErrorContains(t, err, `is not permitted to "sign" for signer "other.trustbridge.test/svid"`,
		"the service account may not decide another signer's requests")
}

func TestKubeRefusesWhatItShouldNot(t *testing.T) {
	r := newRig(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	cases := map[string]struct {
		req    func(t *testing.T) (*certv1beta1.PodCertificateRequest, error)
		reason string
	}{
		"namespace not enabled": {func(t *testing.T) (*certv1beta1.PodCertificateRequest, error) {
			pod := r.pod(t, r.closed, r.signer)
			return r.request(t, pod, key, pod.UID, 86400)
		}, ReasonNamespaceNotEnabled},
		"forged pod UID": {func(t *testing.T) (*certv1beta1.PodCertificateRequest, error) {
			pod := r.pod(t, r.enabled, r.signer)
			// A valid proof over the forged UID: the API server accepts it.
			return r.request(t, pod, key, types.UID("11111111-2222-3333-4444-555555555555"), 86400)
		}, ReasonPodMismatch},
		"pod does not ask for this signer": {func(t *testing.T) (*certv1beta1.PodCertificateRequest, error) {
			pod := r.pod(t, r.enabled, "other.trustbridge.test/svid")
			return r.request(t, pod, key, pod.UID, 86400)
		}, ReasonPodMismatch},
		"Ed25519 key": {func(t *testing.T) (*certv1beta1.PodCertificateRequest, error) {
			pod := r.pod(t, r.enabled, r.signer)
			_, edKey, err := ed25519.GenerateKey(rand.Reader)
			require.NoError(t, err)
			return r.request(t, pod, edKey, pod.UID, 86400)
		}, ReasonUnsupportedKeyType},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			req, err := tc.req(t)
			require.NoError(t, err)
			got := r.outcome(t, req)
			c := condition(got)
			assert.Equal(t, certv1beta1.PodCertificateRequestConditionTypeDenied, c.Type)
			assert.Equal(t, tc.reason, c.Reason, c.Message)
			assert.Empty(t, got.Status.CertificateChain)
		})
	}

	t.Run("proof by another key", func(t *testing.T) {
		pod := r.pod(t, r.enabled, r.signer)
		other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		req, err := r.request(t, pod, other, pod.UID, 86400)
		require.NoError(t, err)
		req.Spec.PKIXPublicKey, _ = x509.MarshalPKIXPublicKey(key.Public())
		req.Name, req.ResourceVersion, req.UID = "", "", ""
		_, err = r.kubelet.CertificatesV1beta1().PodCertificateRequests(pod.Namespace).Create(context.Background(), req, metav1.CreateOptions{})
		assert.ErrorContains(t, err, "proof", "the API server refuses a proof that does not match the key")
	})
}

func pemDERs(t *testing.T, chain string) [][]byte {
	t.Helper()
	var out [][]byte
	rest := []byte(chain)
	for {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		out = append(out, block.Bytes)
	}
	require.NotEmpty(t, out, "no certificate in the chain")
	return out
}

func random(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// With an identity map (Config.Identify) the pod gets the identity it
// gives, DNS names included, and a pod it gives none is Denied saying why.
func TestKubeIdentityFromMap(t *testing.T) {
	r := newRigFor(t, nil, random("t")+".trustbridge.test/svid", false)
	mapped := spiffeid.RequireFromString("spiffe://" + testTD + "/shop/web")
	s, err := New(Config{
		Client: r.env.Client, SignerName: r.signer, TrustDomain: spiffeid.RequireTrustDomainFromString(testTD),
		Authority: r.auth, Namespaces: labels.SelectorFromSet(labels.Set{"podcert-test": r.enableLabel}),
		Identify: func(pod *corev1.Pod) (spiffeid.ID, []string, error) {
			if pod.Labels["app"] != "web" {
				return spiffeid.ID{}, nil, fmt.Errorf("%w: no rule selects pod %s", ErrNoIdentity, pod.Name)
			}
			return mapped, []string{"web.shop.svc"}, nil
		},
		Registerer: prometheus.NewRegistry(),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	web := r.pod(t, r.enabled, r.signer)
	web.Labels = map[string]string{"app": "web"}
	web, err = r.env.Client.CoreV1().Pods(web.Namespace).Update(context.Background(), web, metav1.UpdateOptions{})
	require.NoError(t, err)
	req, err := r.request(t, web, key, web.UID, 86400)
	require.NoError(t, err)
	got := r.outcome(t, req)
	require.Equal(t, certv1beta1.PodCertificateRequestConditionTypeIssued, condition(got).Type, condition(got).Message)
	leaf, err := x509.ParseCertificate(pemDERs(t, got.Status.CertificateChain)[0])
	require.NoError(t, err)
	id, err := x509svid.IDFromCert(leaf)
	require.NoError(t, err)
	assert.Equal(t, mapped, id)
	assert.Equal(t, []string{"web.shop.svc"}, leaf.DNSNames)

	other := r.pod(t, r.enabled, r.signer)
	req, err = r.request(t, other, key, other.UID, 86400)
	require.NoError(t, err)
	c := condition(r.outcome(t, req))
	assert.Equal(t, certv1beta1.PodCertificateRequestConditionTypeDenied, c.Type)
	assert.Equal(t, ReasonNoIdentity, c.Reason)
	assert.Contains(t, c.Message, "no rule selects pod "+other.Name)
}
