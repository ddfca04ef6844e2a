package certservice_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/server/nodeauth"
)

// podNamesRule gives shop/web's pods the Istio form of their ID and two
// DNS names, one of them the pod's own, so two pods of one ID differ.
var podNamesRule = identitymap.Rule{Name: "pod-names", Origin: "test", SPIFFEID: "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/sa/{{.ServiceAccount}}",
	DNSNames:  []string{"{{.PodName}}.{{.Namespace}}.svc", "{{.ServiceAccount}}.{{.Namespace}}.svc"},
	Workloads: []identitymap.Selector{{Namespace: "shop", ServiceAccount: "web"}}}

// The names podNamesRule gives shop/web's pods, and the template's name
// (dnsTemplate) of shop/web.
var (
	web1Names       = []string{"web-1.shop.svc", "web.shop.svc"}
	web2Names       = []string{"web-2.shop.svc", "web.shop.svc"}
	web3Names       = []string{"web-3.shop.svc", "web.shop.svc"} // on another node
	shopWebTemplate = "web.shop.svc.cluster.local"
)

// vmAgent is a node agent outside Kubernetes, listed with --ca-node-agent
// for shopWeb, authenticated by an OIDC issuer's token.
var vmAgent = spiffeid.RequireFromString("spiffe://example.org/vm/web-1")

const vmAgentToken = "vm-agent-token-0123456789"

var vmAgentTokens = authn.AuthenticatorFunc(func(_ context.Context, r authn.Request) (authn.Identity, error) {
	if r.BearerToken != vmAgentToken {
		return authn.Identity{}, authn.ErrNoCredentials
	}
	return authn.Identity{ID: vmAgent, Method: authn.MethodOIDC, Grant: &authn.Grant{Method: authn.MethodOIDC, Ref: "vms", UID: authn.IssuerGrantUID("https://vms.test")}}, nil
})

// startNodeAuthorizer runs the server's node authorizer over a fake API
// server: the node agent's pod and two pods of shop/web on node-a, one
// more on node-b. rules, when any, are its identity map.
func startNodeAuthorizer(t *testing.T, rules ...identitymap.Rule) *nodeauth.Authorizer {
	t.Helper()
	pod := func(ns, name, uid, sa, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
			Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	client := fake.NewClientset(
		pod("istio-system", nodeAgentPod, nodeAgentPodUID, "ztunnel", "node-a"),
		pod("shop", "web-1", "uid-w1", "web", "node-a"),
		pod("shop", "web-2", "uid-w2", "web", "node-a"),
		pod("shop", "web-3", "uid-w3", "web", "node-b"),
	)
	cfg := nodeauth.Config{Client: client, TrustDomain: td}
	if len(rules) > 0 {
		m, err := identitymap.Compile(identitymap.Config{TrustDomain: td}, rules)
		require.NoError(t, err)
		cfg.IdentityMap = identitymap.NewCell(m)
	}
	a, err := nodeauth.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = a.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	require.Eventually(t, a.HasSynced, 10*time.Second, 10*time.Millisecond)
	return a
}

// newNamesFixture serves the node agent and the VM agent with the
// workload DNS name template on, impersonation decided by imp.
func newNamesFixture(t *testing.T, imp certservice.Impersonator) *fixture {
	t.Helper()
	return newDNSFixture(t, func(cfg *certservice.Config) {
		cfg.Authenticator = append(cfg.Authenticator.(authn.Chain), nodeAgentTokens, vmAgentTokens)
		cfg.Impersonator = imp
	})
}

// askNames asks, with token, for target's certificate with a CSR naming
// target and carrying names; it returns the leaf.
func askNames(t *testing.T, f *fixture, token string, target spiffeid.ID, names []string, tmpl *x509.CertificateRequest) (*x509.Certificate, error) {
	t.Helper()
	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(t, err)
	if tmpl == nil {
		tmpl = &x509.CertificateRequest{}
	}
	tmpl.URIs, tmpl.DNSNames = []*url.URL{target.URL()}, names
	md, err := structpb.NewStruct(map[string]any{"ImpersonatedIdentity": target.String()})
	require.NoError(t, err)
	resp, err := f.client(t, nil, token).CreateCertificate(t.Context(),
		&securityv1alpha1.IstioCertificateRequest{Csr: string(pemCSR(mustCSR(t, key, tmpl))), Metadata: md})
	if err != nil {
		return nil, err
	}
	return parseChain(t, resp.CertChain)[0], nil
}

// A node agent's CSR may carry exactly the names the server's identity
// map gives one running pod of its node with the target ID: the leaf
// then carries those and the template's name, and the issuance is logged
// with them. Any other set is refused before the signer sees it.
func TestImpersonatedDNSNames(t *testing.T) {
	f := newNamesFixture(t, startNodeAuthorizer(t, podNamesRule))
	for name, names := range map[string][]string{"one pod's names": web1Names, "the other pod's": web2Names} {
		t.Run(name, func(t *testing.T) {
			leaf, err := askNames(t, f, nodeAgentToken, shopWeb, names, nil)
			require.NoError(t, err)
			assert.Equal(t, append(append([]string(nil), names...), shopWebTemplate), leaf.DNSNames, "the CSR's names and the template's, sorted")
			assert.Len(t, leaf.URIs, 1)
			assert.Equal(t, shopWeb.String(), leaf.URIs[0].String())
		})
	}
	assert.Contains(t, f.logs.String(), `"dns_names":["web-1.shop.svc","web.shop.svc","`+shopWebTemplate+`"]`)
	assert.Contains(t, f.logs.String(), `"impersonated_by":"`+nodeAgentID.String()+`"`)

	// The names compare as a set: a reordered CSR asks for the same.
	leaf, err := askNames(t, f, nodeAgentToken, shopWeb, []string{"web.shop.svc", "web-1.shop.svc"}, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"web-1.shop.svc", "web.shop.svc", shopWebTemplate}, leaf.DNSNames)

	signed := f.signer.calls.Load()
	for _, tc := range []struct {
		name  string
		names []string
		msg   string
	}{
		{"a name the map gives no pod", []string{"db.shop.svc", "web.shop.svc"}, "with exactly the DNS names"},
		{"a subset of one pod's", []string{"web-1.shop.svc"}, "2 of them get that ID with other names"},
		{"a superset of one pod's", append([]string{"extra.shop.svc"}, web1Names...), "2 of them get that ID with other names"},
		{"two pods' names mixed", []string{"web-1.shop.svc", "web-2.shop.svc", "web.shop.svc"}, "2 of them get that ID with other names"},
		{"a pod's names on another node", web3Names, "2 of them get that ID with other names"},
		{"the template's name", []string{shopWebTemplate}, "with exactly the DNS names"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := askNames(t, f, nodeAgentToken, shopWeb, tc.names, nil)
			require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
			assert.ErrorContains(t, err, nodeAgentID.String()+" may not have a certificate for "+shopWeb.String()+" with DNS names")
			assert.ErrorContains(t, err, tc.msg)
		})
	}
	assert.Equal(t, signed, f.signer.calls.Load(), "no refused request reaches the signer")
	assert.Contains(t, f.logs.String(), `"reason":"dns_names_not_allowed"`)

	// More names than a map gives any workload: refused unread.
	many := make([]string, identitymap.MaxIdentityDNSNames+1)
	for i := range many {
		many[i] = fmt.Sprintf("n%d.shop.svc", i)
	}
	_, err = askNames(t, f, nodeAgentToken, shopWeb, many, nil)
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	assert.ErrorContains(t, err, fmt.Sprintf("the CSR requests %d DNS SANs; an identity map gives a workload at most %d", len(many), identitymap.MaxIdentityDNSNames))

	// IP and email SANs stay refused, impersonated or not.
	_, err = askNames(t, f, nodeAgentToken, shopWeb, web1Names, &x509.CertificateRequest{IPAddresses: []net.IP{net.IPv4(10, 0, 0, 1)}})
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	assert.ErrorContains(t, err, "IP SANs")
	_, err = askNames(t, f, nodeAgentToken, shopWeb, nil, &x509.CertificateRequest{EmailAddresses: []string{"web@shop.example"}})
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
}

// Where no identity map gives names, none is granted: a server without
// one, a listed VM agent, an Impersonator that judges no names; and a
// caller asking for its own certificate never has a CSR's names.
func TestImpersonatedDNSNamesRefused(t *testing.T) {
	listed, err := nodeauth.ParseListed(td, []string{vmAgent.String() + "=" + shopWeb.String()})
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		imp   certservice.Impersonator
		token string
		msg   string
	}{
		{"no identity map", startNodeAuthorizer(t), nodeAgentToken, "this server has no identity map (--identity-map)"},
		{"a listed VM agent", nodeauth.Either(listed, startNodeAuthorizer(t, podNamesRule)), vmAgentToken, "listed with --ca-node-agent, carry no DNS names"},
		{"an Impersonator without names", newNodePods(shopWeb), nodeAgentToken, "this server's node authorizer grants no DNS names"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newNamesFixture(t, tc.imp)
			_, err := askNames(t, f, tc.token, shopWeb, web1Names, nil)
			require.Equal(t, codes.PermissionDenied, status.Code(err), "%v\n%s", err, f.logs.String())
			assert.ErrorContains(t, err, tc.msg)
			leaf, err := askNames(t, f, tc.token, shopWeb, nil, nil)
			require.NoError(t, err, "the ID alone is still granted")
			assert.NotContains(t, leaf.DNSNames, "web-1.shop.svc")
			assert.Equal(t, int64(1), f.signer.calls.Load())
		})
	}

	t.Run("not impersonated", func(t *testing.T) {
		f := newNamesFixture(t, startNodeAuthorizer(t, podNamesRule))
		key, err := ca.GenerateKey(ca.KeyECP256)
		require.NoError(t, err)
		csr := pemCSR(mustCSR(t, key, &x509.CertificateRequest{DNSNames: []string{"ztunnel.istio-system.svc"}}))
		_, err = f.client(t, nil, nodeAgentToken).CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: string(csr)})
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		assert.ErrorContains(t, err, "the CSR requests 1 DNS SANs; only the authenticated SPIFFE ID is issued")
		assert.Zero(t, f.signer.calls.Load())
	})
}
