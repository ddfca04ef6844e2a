package podcert

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/trustbridge/trustbridge/ca"
)

// benchRequests is how many pending requests each iteration signs.
const benchRequests = 1000

// BenchmarkPodCertificateRequests measures issue 39's signer on the real
// API server: 1,000 pending PodCertificateRequests (made before the
// timer starts) signed and their status written, from the signer's start
// to the last one decided, against 1,000 in-process SignX509SVID calls of
// the same CA in the same run (baseline:sign). What separates them is the
// API server: each request costs the signer four reads (namespace, pod,
// node, service account) and a status write, made live rather than from a
// cache that may lag.
func BenchmarkPodCertificateRequests(b *testing.B) {
	r := newBenchRig(b)
	b.Run("baseline:sign", func(b *testing.B) {
		for range b.N {
			r.signInProcess(b)
		}
		b.ReportMetric(float64(benchRequests)*float64(b.N)/b.Elapsed().Seconds(), "certs/s")
	})
	b.Run("signer", func(b *testing.B) {
		var signed, baseline time.Duration
		for range b.N {
			b.StopTimer()
			start := time.Now()
			r.signInProcess(b)
			baseline += time.Since(start)
			ns := r.pending(b)
			b.StartTimer()
			start = time.Now()
			r.signAll(b, ns)
			signed += time.Since(start)
		}
		b.ReportMetric(float64(benchRequests)*float64(b.N)/signed.Seconds(), "certs/s")
		b.ReportMetric(signed.Seconds()/baseline.Seconds(), "x-sign")
	})
}

type benchRig struct {
	*rig
	key *ecdsa.PrivateKey
}

func newBenchRig(b *testing.B) *benchRig {
	r := &benchRig{}
	r.rig = newRigFor(b, nil, random("b")+".trustbridge.test/svid", false)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(b, err)
	r.key = key
	return r
}

func (r *benchRig) signInProcess(b *testing.B) {
	id := spiffeid.RequireFromPath(spiffeid.RequireTrustDomainFromString(testTD), "/ns/bench/sa/app")
	for range benchRequests {
		if _, err := r.auth.SignX509SVID(ca.X509SVIDParams{PublicKey: r.key.Public(), SPIFFEID: id, TTL: time.Hour}); err != nil {
			b.Fatal(err)
		}
	}
}

// pending makes a fresh enabled namespace holding one pod and
// benchRequests pending requests for it, and returns the namespace.
func (r *benchRig) pending(b *testing.B) string {
	ns := r.env.Namespace(b)
	r.enable(b, ns)
	pod := r.pod(b, ns, r.signer)
	der, err := x509.MarshalPKIXPublicKey(r.key.Public())
	require.NoError(b, err)
	sum := sha256.Sum256([]byte(pod.UID))
	proof, err := ecdsa.SignASN1(rand.Reader, r.key, sum[:])
	require.NoError(b, err)
	sa, err := r.env.Client.CoreV1().ServiceAccounts(ns).Get(context.Background(), "app", metav1.GetOptions{})
	require.NoError(b, err)
	pcrs := r.env.Client.CertificatesV1beta1().PodCertificateRequests(ns)
	for i := range benchRequests {
		_, err := pcrs.Create(context.Background(), &certv1beta1.PodCertificateRequest{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("r%04d", i)},
			Spec: certv1beta1.PodCertificateRequestSpec{SignerName: r.signer, PodName: pod.Name, PodUID: pod.UID,
				ServiceAccountName: "app", ServiceAccountUID: sa.UID, NodeName: types.NodeName(r.node.Name), NodeUID: r.node.UID,
				PKIXPublicKey: der, ProofOfPossession: proof},
		}, metav1.CreateOptions{})
		require.NoError(b, err)
	}
	return ns
}

// signAll runs a signer until every request of ns is decided.
func (r *benchRig) signAll(b *testing.B, ns string) {
	s, err := New(Config{Client: r.env.Client, SignerName: r.signer, TrustDomain: spiffeid.RequireTrustDomainFromString(testTD),
		Authority: r.auth, Namespaces: labels.SelectorFromSet(labels.Set{"podcert-test": r.enableLabel}),
		Registerer: prometheus.NewRegistry(), Workers: 8})
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(b, <-done)
	}()
	pcrs := r.env.Client.CertificatesV1beta1().PodCertificateRequests(ns)
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		l, err := pcrs.List(ctx, metav1.ListOptions{})
		require.NoError(b, err)
		decided := 0
		for i := range l.Items {
			if c := l.Items[i].Status.Conditions; len(c) > 0 {
				require.Equal(b, certv1beta1.PodCertificateRequestConditionTypeIssued, c[len(c)-1].Type, c[len(c)-1].Message)
				decided++
			}
		}
		if decided == benchRequests {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Fatal("the signer did not decide every request within 5 minutes")
}
