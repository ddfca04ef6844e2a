package certservice_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/workloaddns"
)

const dnsTemplate = "{sa}.{ns}.svc.cluster.local"

// Tokens of dnsTokens, each proving a service-account-shaped ID by a
// different method.
const (
	kubeToken       = "kube-token-0123456789"
	issuerToken     = "issuer-token-0123456789"
	oidcToken       = "oidc-token-0123456789"
	dottedToken     = "dotted-token-0123456789"
	mismatchToken   = "mismatch-token-0123456789"
	bootSAToken     = "bootstrap-sa-token-abcdefghijklmnop"
	webDNSName      = "web.default.svc.cluster.local"
	apiDNSName      = "api.shop.svc.cluster.local"
	dottedSAPath    = "/ns/default/sa/web.v2"
	bootstrapSAPath = "/ns/boot/sa/vm"
)

// dnsTokens proves identities as the real authenticators would, grants
// included.
var dnsTokens = authn.AuthenticatorFunc(func(_ context.Context, r authn.Request) (authn.Identity, error) {
	kube := func(path, ref string) authn.Identity {
		return authn.Identity{ID: spiffeid.RequireFromPath(td, path), Method: authn.MethodKubernetesJWT,
			Grant: &authn.Grant{Method: authn.MethodKubernetesJWT, Ref: ref, UID: "uid-1"}}
	}
	switch r.BearerToken {
	case "":
		return authn.Identity{}, authn.ErrNoCredentials
	case kubeToken:
		return kube("/ns/default/sa/web", "default/web"), nil
	case dottedToken:
		return kube(dottedSAPath, "default/web.v2"), nil
	case mismatchToken:
		return kube("/ns/default/sa/web", "default/db"), nil
	case issuerToken:
		return authn.Identity{ID: spiffeid.RequireFromPath(td, "/ns/shop/sa/api"), Method: authn.MethodKubernetesIssuer,
			Grant: &authn.Grant{Method: authn.MethodKubernetesIssuer, Ref: "cluster-b", UID: authn.IssuerGrantUID("https://oidc.cluster-b.test")}}, nil
	case oidcToken:
		// An OIDC issuer whose template happens to make a service
		// account's shape: still no DNS name.
		return authn.Identity{ID: spiffeid.RequireFromPath(td, "/ns/default/sa/web"), Method: authn.MethodOIDC,
			Grant: &authn.Grant{Method: authn.MethodOIDC, Ref: "github", UID: authn.IssuerGrantUID("https://token.actions.githubusercontent.com")}}, nil
	}
	return authn.Identity{}, fmt.Errorf("not ours: %w", authn.ErrNoCredentials)
})

// newDNSFixture serves dnsTokens, a bootstrap token for an ID of a
// service account's shape, and X509-SVID renewals, with the workload DNS
// name template on. mutate may change more.
func newDNSFixture(t *testing.T, mutate func(*certservice.Config)) *fixture {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens.csv")
	require.NoError(t, os.WriteFile(p, []byte(bootSAToken+",spiffe://example.org"+bootstrapSAPath+",reusable\n"), 0o600))
	boot, err := authn.LoadBootstrapTokens(p, td)
	require.NoError(t, err)
	tmpl, err := workloaddns.Parse(dnsTemplate, td)
	require.NoError(t, err)
	accept := authn.GrantCheckerFunc(func(context.Context, spiffeid.ID, authn.Grant) error { return nil })
	return newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.Authenticator = authn.Chain{authn.NewX509SVID(td, localRoots{a}, nil), dnsTokens, boot}
		cfg.Grants = map[string]authn.GrantChecker{
			authn.MethodBootstrapToken: boot, authn.MethodKubernetesJWT: accept,
			authn.MethodKubernetesIssuer: accept, authn.MethodOIDC: accept,
		}
		cfg.WorkloadDNSNames = tmpl
		if mutate != nil {
			mutate(cfg)
		}
	})
}

// checkLeaf verifies the leaf as a go-spiffe peer and as a plain TLS
// client would, and returns its DNS names.
func checkLeaf(t *testing.T, f *fixture, cert *tls.Certificate, want spiffeid.ID) []string {
	t.Helper()
	id, _, err := x509svid.ParseAndVerify([][]byte{cert.Leaf.Raw}, f.authority.Bundle().X509Bundle())
	require.NoError(t, err, "still an X509-SVID")
	assert.Equal(t, want, id)
	require.Len(t, cert.Leaf.URIs, 1, "the SPIFFE ID is never replaced")
	roots := x509.NewCertPool()
	for _, r := range f.authority.Bundle().X509Authorities() {
		roots.AddCert(r)
	}
	for _, name := range cert.Leaf.DNSNames {
		_, err := cert.Leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots})
		assert.NoError(t, err, "a plain TLS client dialing %s accepts it", name)
	}
	return cert.Leaf.DNSNames
}

func TestWorkloadDNSNamesByMethod(t *testing.T) {
	f := newDNSFixture(t, nil)
	for _, tc := range []struct {
		name, token string
		id          spiffeid.ID
		want        []string
	}{
		{"kubernetes-jwt", kubeToken, workloadID, []string{webDNSName}},
		{"kubernetes-issuer", issuerToken, spiffeid.RequireFromPath(td, "/ns/shop/sa/api"), []string{apiDNSName}},
		{"oidc", oidcToken, workloadID, nil},
		{"bootstrap token", bootSAToken, spiffeid.RequireFromPath(td, bootstrapSAPath), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cert, err := request(t, f.client(t, nil, tc.token))
			require.NoError(t, err)
			assert.Equal(t, tc.want, checkLeaf(t, f, cert, tc.id))
		})
	}
	assert.Equal(t, 2.0, testutil.ToFloat64(f.svc.WorkloadDNSNamesForTest("added")))
	assert.Equal(t, 0.0, testutil.ToFloat64(f.svc.WorkloadDNSNamesForTest("skipped")), "other methods are not counted")
	assert.Contains(t, f.logs.String(), `"dns_names":["`+webDNSName+`"]`)
}

// TestWorkloadDNSNamesRenewal: a renewal copies the first grant, and the
// grant decides; a Kubernetes-granted chain keeps its name, a
// bootstrap-granted one never gets one.
func TestWorkloadDNSNamesRenewal(t *testing.T) {
	f := newDNSFixture(t, nil)
	for _, tc := range []struct {
		name, token string
		id          spiffeid.ID
		want        []string
	}{
		{"kubernetes", kubeToken, workloadID, []string{webDNSName}},
		{"kubernetes issuer", issuerToken, spiffeid.RequireFromPath(td, "/ns/shop/sa/api"), []string{apiDNSName}},
		{"bootstrap", bootSAToken, spiffeid.RequireFromPath(td, bootstrapSAPath), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cert, err := request(t, f.client(t, nil, tc.token))
			require.NoError(t, err)
			for i := range 2 {
				cert, err = request(t, f.client(t, cert, ""))
				require.NoError(t, err, "renewal %d", i)
				assert.Equal(t, tc.want, checkLeaf(t, f, cert, tc.id), "renewal %d", i)
			}
		})
	}
}

// TestWorkloadDNSNamesCSRStillRefused: the name comes from the template
// only; a CSR asking for one, even the very name the template would give,
// is refused before the signer sees it.
func TestWorkloadDNSNamesCSRStillRefused(t *testing.T) {
	f := newDNSFixture(t, nil)
	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(t, err)
	csr := pemCSR(mustCSR(t, key, &x509.CertificateRequest{DNSNames: []string{webDNSName}}))
	_, err = f.client(t, nil, kubeToken).CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: string(csr)})
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	assert.ErrorContains(t, err, "DNS SANs")
	assert.Zero(t, f.signer.calls.Load())
}

// TestWorkloadDNSNamesSkipped: a Kubernetes identity that cannot have a
// name gets its certificate without one, a Warn line with the reason and
// a count.
func TestWorkloadDNSNamesSkipped(t *testing.T) {
	f := newDNSFixture(t, nil)
	for _, tc := range []struct {
		name, token, reason string
		id                  spiffeid.ID
	}{
		{"dotted service account", dottedToken, `service account \"web.v2\": holds '.'`, spiffeid.RequireFromPath(td, dottedSAPath)},
		{"grant of another account", mismatchToken, `the grant names service account \"default/db\"`, workloadID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cert, err := request(t, f.client(t, nil, tc.token))
			require.NoError(t, err, "the certificate is still issued")
			assert.Empty(t, checkLeaf(t, f, cert, tc.id))
			assert.Contains(t, f.logs.String(), tc.reason)
		})
	}
	assert.Equal(t, 2.0, testutil.ToFloat64(f.svc.WorkloadDNSNamesForTest("skipped")))
	assert.Equal(t, 0.0, testutil.ToFloat64(f.svc.WorkloadDNSNamesForTest("added")))
	assert.Contains(t, f.logs.String(), `"level":"WARN","msg":"certificate issued without a workload DNS name`)
}

// TestWorkloadDNSNamesImpersonation: a node proxy that proved itself with
// a Kubernetes token gets its pods' certificates with their DNS names
// (the Impersonator checked the pod's service account is on its node); a
// proxy authenticated otherwise gives its targets none.
func TestWorkloadDNSNamesImpersonation(t *testing.T) {
	node := spiffeid.RequireFromString("spiffe://example.org/ns/istio-system/sa/ztunnel")
	target := spiffeid.RequireFromString("spiffe://example.org/ns/shop/sa/web")
	const kubeNode, oidcNode = "kube-node-token-0123456789", "oidc-node-token-0123456789"
	tokens := authn.AuthenticatorFunc(func(_ context.Context, r authn.Request) (authn.Identity, error) {
		switch r.BearerToken {
		case kubeNode:
			return authn.Identity{ID: node, Method: authn.MethodKubernetesJWT,
				Grant: &authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "istio-system/ztunnel"}}, nil
		case oidcNode:
			return authn.Identity{ID: node, Method: authn.MethodOIDC, Grant: &authn.Grant{Method: authn.MethodOIDC, Ref: "nodes", UID: authn.IssuerGrantUID("https://nodes.test")}}, nil
		}
		return authn.Identity{}, authn.ErrNoCredentials
	})
	f := newDNSFixture(t, func(cfg *certservice.Config) {
		cfg.Authenticator = tokens
		cfg.Impersonator = fakeImpersonator{allowed: node, target: target}
	})
	md, err := structpb.NewStruct(map[string]any{"ImpersonatedIdentity": target.String()})
	require.NoError(t, err)
	for _, tc := range []struct {
		name, token, ref string
		want             []string
	}{
		{"kubernetes node proxy", kubeNode, "istio-system/ztunnel", []string{"web.shop.svc.cluster.local"}},
		{"oidc node proxy", oidcNode, "nodes", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, err := ca.GenerateKey(ca.KeyECP256)
			require.NoError(t, err)
			resp, err := f.client(t, nil, tc.token).CreateCertificate(t.Context(),
				&securityv1alpha1.IstioCertificateRequest{Csr: newCSR(t, key), Metadata: md})
			require.NoError(t, err)
			cert := tlsCert(parseChain(t, resp.CertChain)[0], key)
			assert.Equal(t, tc.want, checkLeaf(t, f, cert, target))
			g, err := authn.GrantFromCert(cert.Leaf)
			require.NoError(t, err)
			assert.Equal(t, tc.ref, g.Ref, "the proxy's grant is recorded, not the target's")
		})
	}
}

// TestWorkloadDNSNamesOff: without a template no certificate gets a name.
func TestWorkloadDNSNamesOff(t *testing.T) {
	f := newDNSFixture(t, func(cfg *certservice.Config) { cfg.WorkloadDNSNames = nil })
	cert, err := request(t, f.client(t, nil, kubeToken))
	require.NoError(t, err)
	assert.Empty(t, checkLeaf(t, f, cert, workloadID))
}

func mustCSR(t *testing.T, key crypto.Signer, tmpl *x509.CertificateRequest) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	require.NoError(t, err)
	return der
}
