package main

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// publishIssuerDiscovery lets anonymous callers read the API server's
// service account issuer discovery, as a cluster whose issuer is public
// does (Kubernetes documents this binding for it).
func publishIssuerDiscovery(t *testing.T, k *kubetest.Env) {
	t.Helper()
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "trustbridge-test-public-issuer-discovery"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:service-account-issuer-discovery"},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "Group", Name: "system:unauthenticated"}},
	}
	_, err := k.Client.RbacV1().ClusterRoleBindings().Create(t.Context(), crb, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	k.WaitRBAC(t, crb)
}

// tokenIssuer reads a JWT's iss claim without verifying anything.
func tokenIssuer(t *testing.T, token string) string {
	t.Helper()
	parts := strings.Split(token, ".")
	require.Len(t, parts, 3)
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	var c struct {
		Iss string `json:"iss"`
	}
	require.NoError(t, json.Unmarshal(payload, &c))
	require.NotEmpty(t, c.Iss)
	return c.Iss
}

// TestRemoteClusterIssuerE2E: a server with no connection to a cluster
// (no kubeconfig, no TokenReview) verifies that cluster's projected
// service account tokens offline against its service account issuer
// (the real kube-apiserver's discovery document and JWKS) and issues
// spiffe://example.org/ns/<ns>/sa/<sa> from the token's kubernetes.io
// claims; the namespace rule and the audience still apply.
func TestRemoteClusterIssuerE2E(t *testing.T) {
	k := kubetest.Shared(t)
	publishIssuerDiscovery(t, k)
	ns, other := k.Namespace(t), k.Namespace(t)
	token := k.ServiceAccountToken(t, ns, "web", []string{"example.org"}, 10*time.Minute)
	issuer := tokenIssuer(t, token)

	caFile := servertest.WriteFile(t, string(k.Config.CAData), 0o644)
	cfg := servertest.WriteFile(t, fmt.Sprintf(`issuers:
- name: west
  kind: kubernetes
  issuer: %s
  audiences: [example.org]
  caFile: %s
  allowPrivateAddresses: true
  claims:
  - claim: kubernetes.io.namespace
    values: [%s]
`, issuer, caFile, ns), 0o644)
	var dataDir string
	srv := startAttackTarget(t, func(o *server.Config) {
		o.GRPC.OIDC = server.OIDCConfig{File: cfg}
		o.GRPC.WorkloadDNSNameTemplate = "{sa}.{ns}.svc.cluster.local"
		dataDir = o.DataDir
	})
	addr, rootCert := srv.grpc, rootCertFile(t, dataDir)

	want := spiffeid.RequireFromString("spiffe://example.org/ns/" + ns + "/sa/web")
	out := filepath.Join(t.TempDir(), "creds")
	stdout, stderr, code := runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert,
		"--token-file", servertest.WriteFile(t, token, 0o600), "--credentials-dir", out)
	require.Equal(t, 0, code, "%s\n%s", stderr, srv.logs.String())
	assert.Contains(t, stdout, "issued "+want.String())
	leaf := checkCreds(t, out, want)
	g, err := authn.GrantFromCert(leaf)
	require.NoError(t, err)
	assert.Equal(t, authn.MethodKubernetesIssuer, g.Method)
	assert.Equal(t, "west", g.Ref)

	// A remote cluster's token is a Kubernetes token: the certificate
	// also carries the OSM-style name, which a plain TLS client checks.
	host := "web." + ns + ".svc.cluster.local"
	assert.Equal(t, []string{host}, leaf.DNSNames)
	roots, err := cli.ReadPEMCerts(rootCert)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: host})
	assert.NoError(t, err)

	for name, tt := range map[string]struct{ token, stderr string }{
		"a namespace the rule does not allow": {k.ServiceAccountToken(t, other, "web", []string{"example.org"}, 10*time.Minute), "refused to issue this identity"},
		"another audience":                    {k.ServiceAccountToken(t, ns, "web", []string{"someone-else"}, 10*time.Minute), "did not accept the credentials"},
	} {
		t.Run(name, func(t *testing.T) {
			_, stderr, code := runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert,
				"--token-file", servertest.WriteFile(t, tt.token, 0o600), "--credentials-dir", t.TempDir())
			assert.Equal(t, 1, code)
			assert.Contains(t, stderr, tt.stderr)
		})
	}
}
