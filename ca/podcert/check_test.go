package podcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const signer = "trustbridge.io/svid"

func TestSupportedKey(t *testing.T) {
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p521, _ := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	rsa2048, _ := rsa.GenerateKey(rand.Reader, 2048)
	for name, tc := range map[string]struct {
		key  any
		want string // "" accepted, else the message's start
	}{
		"P-256":    {p256.Public(), ""},
		"P-521":    {p521.Public(), "ECDSA curve P-521 is not signed here"},
		"RSA 2048": {rsa2048.Public(), "RSA 2048 is not signed here"},
	} {
		t.Run(name, func(t *testing.T) {
			der, err := x509.MarshalPKIXPublicKey(tc.key)
			require.NoError(t, err)
			pub, ref := supportedKey(der)
			if tc.want == "" {
				assert.Nil(t, ref)
				assert.NotNil(t, pub)
				return
			}
			require.NotNil(t, ref)
			assert.Equal(t, ReasonUnsupportedKeyType, ref.reason)
			assert.Contains(t, ref.message, tc.want)
		})
	}
	_, ref := supportedKey([]byte("not a key"))
	require.NotNil(t, ref)
	assert.Contains(t, ref.message, "does not parse")
}

func TestCheckProof(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	sum := sha256.Sum256([]byte("uid-1"))
	proof, err := ecdsa.SignASN1(rand.Reader, key, sum[:])
	require.NoError(t, err)
	assert.Nil(t, checkProof(key.Public(), "uid-1", proof))
	assert.NotNil(t, checkProof(key.Public(), "uid-2", proof), "a proof over another pod's UID")
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	assert.NotNil(t, checkProof(other.Public(), "uid-1", proof), "a proof by another key")
	assert.NotNil(t, checkProof(key.Public(), "uid-1", nil))

	rk, _ := rsa.GenerateKey(rand.Reader, 3072)
	rproof, err := rsa.SignPSS(rand.Reader, rk, 0x5 /* crypto.SHA256 */, sum[:], nil)
	require.NoError(t, err)
	assert.Nil(t, checkProof(rk.Public(), "uid-1", rproof))
}

func TestCheckPod(t *testing.T) {
	req := &certv1beta1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "r"},
		Spec: certv1beta1.PodCertificateRequestSpec{
			SignerName: signer, PodName: "web", PodUID: "pod-uid", NodeName: "n1", NodeUID: "node-uid",
			ServiceAccountName: "web-sa", ServiceAccountUID: "sa-uid",
		},
	}
	good := func() (*corev1.Pod, *corev1.Node, *corev1.ServiceAccount) {
		return &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "web", UID: "pod-uid"},
				Spec: corev1.PodSpec{NodeName: "n1", ServiceAccountName: "web-sa", Volumes: []corev1.Volume{{
					VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
						{PodCertificate: &corev1.PodCertificateProjection{SignerName: signer}},
					}}},
				}}},
			}, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "node-uid"}},
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "web-sa", UID: "sa-uid"}}
	}
	pod, node, sa := good()
	assert.Nil(t, checkPod(req, pod, node, sa, signer))

	now := metav1.NewTime(time.Now())
	for name, tc := range map[string]struct {
		mutate func(*corev1.Pod, *corev1.Node, *corev1.ServiceAccount) (*corev1.Pod, *corev1.Node, *corev1.ServiceAccount)
		want   string
	}{
		"no pod": {func(_ *corev1.Pod, n *corev1.Node, s *corev1.ServiceAccount) (*corev1.Pod, *corev1.Node, *corev1.ServiceAccount) {
			return nil, n, s
		}, "does not exist"},
		"pod UID": {func(p *corev1.Pod, n *corev1.Node, s *corev1.ServiceAccount) (*corev1.Pod, *corev1.Node, *corev1.ServiceAccount) {
			p.UID = "x"
			return p, n, s
		}, "does not have the UID the request names"},
		"terminating": {func(p *corev1.Pod, n *corev1.Node, s *corev1.ServiceAccount) (*corev1.Pod, *corev1.Node, *corev1.ServiceAccount) {
			p.DeletionTimestamp = &now
			return p, n, s
		}, "terminating"},
		"succeeded": {func(p *corev1.Pod, n *corev1.Node, s *corev1.ServiceAccount) (*corev1.Pod, *corev1.Node, *corev1.ServiceAccount) {
			p.Status.Phase = corev1.PodSucceeded
			return p, n, s
		}, "terminated"},
		"other node": {func(p *corev1.Pod, n *corev1.Node, s *corev1.ServiceAccount) (*corev1.Pod, *corev1.Node, *corev1.ServiceAccount) {
			p.Spec.NodeName = "n2"
			return p, n, s
		}, `is not bound to node "n1"`},
		"unscheduled": {func(p *corev1.Pod, n *corev1.Node, s *corev1.ServiceAccount) (*corev1.Pod, *corev1.Node, *corev1.ServiceAccount) {
			p.Spec.NodeName = ""
			return p, n, s
		}, `is not bound to node "n1"`},
		"node UID": {func(p *corev1.Pod, n *corev1.Node, s *corev1.ServiceAccount) (*corev1.Pod, *corev1.Node, *corev1.ServiceAccount) {
			n.UID = "y"
			return p, n, s
		}, `node "n1" does not exist or does not have the UID`},
		"no node": {func(p *corev1.Pod, _ *corev1.Node, s *corev1.ServiceAccount) (*corev1.Pod, *corev1.Node, *corev1.ServiceAccount) {
			return p, nil, s
		}, `node "n1" does not exist`},
		"service account": {func(p *corev1.Pod, n *corev1.Node, s *corev1.ServiceAccount) (*corev1.Pod, *corev1.Node, *corev1.ServiceAccount) {
			p.Spec.ServiceAccountName = "root"
			return p, n, s
		}, `does not run as service account "web-sa"`},
		"SA UID": {func(p *corev1.Pod, n *corev1.Node, s *corev1.ServiceAccount) (*corev1.Pod, *corev1.Node, *corev1.ServiceAccount) {
			s.UID = "z"
			return p, n, s
		}, "does not exist or does not have the UID"},
		"no volume": {func(p *corev1.Pod, n *corev1.Node, s *corev1.ServiceAccount) (*corev1.Pod, *corev1.Node, *corev1.ServiceAccount) {
			p.Spec.Volumes = nil
			return p, n, s
		}, "no podCertificate volume"},
	} {
		t.Run(name, func(t *testing.T) {
			p, n, s := tc.mutate(good())
			ref := checkPod(req, p, n, s, signer)
			require.NotNil(t, ref)
			assert.Equal(t, ReasonPodMismatch, ref.reason)
			assert.Contains(t, ref.message, tc.want)
		})
	}
}

func TestLifetime(t *testing.T) {
	secs := func(n int32) *int32 { return &n }
	for name, tc := range map[string]struct {
		max    *int32
		caMax  time.Duration
		want   time.Duration
		failed bool
	}{
		"default day":        {nil, 0, 24 * time.Hour, false},
		"asked two hours":    {secs(7200), 24 * time.Hour, 2 * time.Hour, false},
		"clamped to the CA":  {secs(7862400), 12 * time.Hour, 12 * time.Hour, false},
		"CA under an hour":   {nil, 30 * time.Minute, 0, true},
		"asked exactly hour": {secs(3600), time.Hour, time.Hour, false},
	} {
		t.Run(name, func(t *testing.T) {
			req := &certv1beta1.PodCertificateRequest{Spec: certv1beta1.PodCertificateRequestSpec{MaxExpirationSeconds: tc.max}}
			got, ref := lifetime(req, tc.caMax)
			if tc.failed {
				require.NotNil(t, ref)
				assert.True(t, ref.failed)
				assert.Contains(t, ref.message, "--max-workload-ttl")
				return
			}
			assert.Nil(t, ref)
			assert.Equal(t, tc.want, got)
		})
	}
}

// FuzzRequestKey feeds the untrusted key and proof of a request through
// what the signer does with them: it never panics, and accepts a key only
// when it is one it signs for.
func FuzzRequestKey(f *testing.F) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKIXPublicKey(key.Public())
	sum := sha256.Sum256([]byte("uid"))
	proof, _ := ecdsa.SignASN1(rand.Reader, key, sum[:])
	f.Add(der, []byte("uid"), proof)
	f.Add([]byte{0x30, 0x03, 0x02, 0x01, 0x00}, []byte(""), []byte{})
	f.Fuzz(func(t *testing.T, der, uid, proof []byte) {
		pub, ref := supportedKey(der)
		if ref != nil {
			if pub != nil {
				t.Fatal("a refused key was returned")
			}
			return
		}
		_ = checkProof(pub, string(uid), proof)
	})
}

func TestCheckIssued(t *testing.T) {
	now := time.Now()
	leaf := func(life time.Duration) *x509.Certificate {
		return &x509.Certificate{NotBefore: now, NotAfter: now.Add(life)}
	}
	assert.Nil(t, checkIssued(leaf(time.Hour), time.Hour))
	assert.Nil(t, checkIssued(leaf(2*time.Hour), 24*time.Hour))
	ref := checkIssued(leaf(time.Hour+time.Second), time.Hour)
	require.NotNil(t, ref)
	assert.Contains(t, ref.message, "over the 1h0m0s asked for")
	ref = checkIssued(leaf(30*time.Minute), 24*time.Hour)
	require.NotNil(t, ref)
	assert.True(t, ref.failed)
	assert.Contains(t, ref.message, "rotate the CA")
	assert.NotNil(t, checkIssued(nil, time.Hour))
}

// A denial never tells the reader of the request the pod's real UID or
// node, which a forger could use to forge better.
func TestCheckPodRevealsNothing(t *testing.T) {
	req := &certv1beta1.PodCertificateRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "apps"},
		Spec: certv1beta1.PodCertificateRequestSpec{PodName: "web", PodUID: "forged", NodeName: "n9", NodeUID: "n9-uid", ServiceAccountName: "web-sa"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "real-pod-uid"}, Spec: corev1.PodSpec{NodeName: "real-node"}}
	ref := checkPod(req, pod, nil, nil, signer)
	require.NotNil(t, ref)
	assert.NotContains(t, ref.message, "real-pod-uid")
	req.Spec.PodUID = "real-pod-uid"
	ref = checkPod(req, pod, nil, nil, signer)
	require.NotNil(t, ref)
	assert.NotContains(t, ref.message, "real-node")
}

func TestClip(t *testing.T) {
	assert.Equal(t, "short", clip("short"))
	long := clip(strings.Repeat("x", 40<<10))
	assert.LessOrEqual(t, len(long), maxMessage)
	assert.True(t, strings.HasSuffix(long, "…"))
}
