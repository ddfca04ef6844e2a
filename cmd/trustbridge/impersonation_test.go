package main

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/url"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// Ambient mode against a real API server (issue 15 item 2): ztunnel, with
// a token bound to its pod on node-a, gets the certificate of a workload
// whose pod runs on node-a, and nothing else: not a workload of node-b,
// not with a token bound to no pod, not as an account that is no node
// proxy; and a workload whose pod leaves node-a stops being impersonable.
func TestZtunnelImpersonation(t *testing.T) {
	k := kubetest.Shared(t)
	kubeconfig := servertest.WriteKubeconfig(t, k.Config.Host, k)
	ns := k.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pods := k.Client.CoreV1().Pods(ns)
	for _, sa := range []string{"ztunnel", "web", "api"} {
		_, err := k.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	noToken := false
	pod := func(name, sa, node string) *corev1.Pod {
		p, err := pods.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node, AutomountServiceAccountToken: &noToken,
				Containers: []corev1.Container{{Name: "c", Image: "example.invalid/none"}}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		return p
	}
	zt := pod("ztunnel-a", "ztunnel", "node-a")
	pod("web-a", "web", "node-a")
	pod("api-b", "api", "node-b")

	secs := int64(600)
	tr, err := k.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "ztunnel", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences: []string{"example.org"}, ExpirationSeconds: &secs,
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: zt.Name, UID: zt.UID},
	}}, metav1.CreateOptions{})
	require.NoError(t, err)
	bound := tr.Status.Token
	unbound := k.ServiceAccountToken(t, ns, "ztunnel", []string{"example.org"}, 10*time.Minute)
	webToken := k.ServiceAccountToken(t, ns, "web", []string{"example.org"}, 10*time.Minute)

	addr, rootCert, _ := grpcServer(t, func(o *server.Config) {
		o.GRPC.TokenReview = server.TokenReviewOn
		o.GRPC.Kubeconfig = kubeconfig
		o.GRPC.TrustedNodeAccounts = []string{ns + "/ztunnel"}
	})
	roots, err := cli.ReadPEMCerts(rootCert)
	require.NoError(t, err)
	td := spiffeid.RequireTrustDomainFromString("example.org")
	workload := func(sa string) spiffeid.ID { return spiffeid.RequireFromSegments(td, "ns", ns, "sa", sa) }

	// impersonate asks, as ztunnel does, for target's certificate with a
	// CSR naming target and the ImpersonatedIdentity metadata.
	var lastKey crypto.Signer
	impersonate := func(token string, target spiffeid.ID) (*x509.Certificate, error) {
		conn, err := grpc.NewClient(addr,
			grpc.WithTransportCredentials(credentials.NewTLS(caclient.ServerTLS(roots, spiffeid.RequireFromPath(td, server.GRPCServingPath), nil))),
			grpc.WithPerRPCCredentials(caclient.BearerToken(token)))
		require.NoError(t, err)
		defer conn.Close()
		key := testca.NewKey(t, testca.ECP256)
		lastKey = key
		csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{target.URL()}}, key)
		require.NoError(t, err)
		md, err := structpb.NewStruct(map[string]any{"ImpersonatedIdentity": target.String()})
		require.NoError(t, err)
		resp, err := securityv1alpha1.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{
			Csr: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr})), ValidityDuration: 3600, Metadata: md,
		})
		if err != nil {
			return nil, err
		}
		certs, err := caclient.ParsePEMCerts([]byte(resp.CertChain[0]))
		require.NoError(t, err)
		return certs[0], nil
	}

	// The informer lists the pods as the server starts; until then the
	// answer is Unavailable, for ztunnel to retry.
	var leaf *x509.Certificate
	require.Eventually(t, func() bool {
		leaf, err = impersonate(bound, workload("web"))
		return status.Code(err) != codes.Unavailable
	}, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, err)
	id, err := x509svid.IDFromCert(leaf)
	require.NoError(t, err)
	assert.Equal(t, workload("web"), id, "web's certificate, issued to ztunnel")

	// That certificate never renews as web: it records ztunnel's grant.
	webCert := &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: lastKey, Leaf: leaf}
	_, err = caclient.CreateCertificate(ctx, addr, caclient.ServerTLS(roots, spiffeid.RequireFromPath(td, server.GRPCServingPath), webCert),
		caclient.Request{Key: testca.NewKey(t, testca.ECP256)})
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "renewal with an impersonated certificate: %v", err)

	for name, tt := range map[string]struct {
		token  string
		target spiffeid.ID
		msg    string
	}{
		"a workload on another node": {bound, workload("api"), "no running pod"},
		"a token bound to no pod":    {unbound, workload("web"), "not bound to a pod"},
		"not a node proxy":           {webToken, workload("api"), "not a trusted node account"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := impersonate(tt.token, tt.target)
			assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
			assert.ErrorContains(t, err, tt.msg)
		})
	}

	// web's pod leaves node-a: once the server's informer sees it, web is
	// no longer impersonable there.
	require.NoError(t, pods.Delete(ctx, "web-a", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
	require.Eventually(t, func() bool {
		_, err := impersonate(bound, workload("web"))
		return status.Code(err) == codes.PermissionDenied
	}, 30*time.Second, 50*time.Millisecond)
}
