package kubecsr_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/upstream/kubecsr"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// overlayCSRRule is the rule deploy/examples/upstream-kube-csr adds to
// the server's ClusterRole (the Helm chart's upstream.kubeCSR renders the
// same one; its tests check that).
func overlayCSRRule(t *testing.T) rbacv1.PolicyRule {
	t.Helper()
	data, err := os.ReadFile("../../../deploy/examples/upstream-kube-csr/clusterrole-csr.yaml")
	require.NoError(t, err)
	var patch []struct {
		Op    string            `json:"op"`
		Path  string            `json:"path"`
		Value rbacv1.PolicyRule `json:"value"`
	}
	require.NoError(t, yaml.UnmarshalStrict(data, &patch))
	require.Len(t, patch, 1)
	require.Equal(t, "/rules/-", patch[0].Path)
	return patch[0].Value
}

// The rule the deploy overlay grants is all the kube-csr client needs,
// run as a service account holding only it: without it the API server
// refuses the CSR and the error says so.
func TestAPIServerRBAC(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	const signer = "example.com/trustbridge-rbac"
	td := spiffeid.RequireTrustDomainFromString("region.example")
	upstream := testca.New(t, "corp.example", testca.Options{NotAfter: time.Now().Add(365 * 24 * time.Hour)})
	ctx := context.Background()
	user := "system:serviceaccount:" + ns + ":trustbridge"
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:serviceaccounts", "system:authenticated"}}
	asServer, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	client, err := kubecsr.New(kubecsr.Config{Client: asServer, SignerName: signer, TrustDomain: td.Name(), Roots: []*x509.Certificate{upstream.Cert}, Timeout: time.Minute})
	require.NoError(t, err)
	key := testca.NewKey(t, testca.ECP256)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{td.ID().URL()}}, key)
	require.NoError(t, err)
	testSigner(t, env.Client, signer, td.Name(), upstream, false)

	_, err = client.SignIntermediate(ctx, der, time.Hour)
	require.Error(t, err, "no rule, no CSR")
	require.True(t, apierrors.IsForbidden(err), "%v", err)

	// Granted, then waited for: the API server's RBAC authorizer reads
	// bindings from a cache, and a call made at once can still be refused.
	name := "trustbridge-csr-" + ns
	rbac := env.Client.RbacV1()
	t.Cleanup(func() {
		_ = rbac.ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = rbac.ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	env.Apply(t, nil, []runtime.Object{
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{overlayCSRRule(t)}},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
		},
	})

	chain, err := client.SignIntermediate(ctx, der, time.Hour)
	require.NoError(t, err, "the overlay's rule is enough")
	require.NoError(t, ca.CheckUpstreamChain(time.Now(), td, key.Public(), client.String(), chain))
}
