package nodeauth

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
)

func labelled(p *corev1.Pod, kv ...string) *corev1.Pod {
	p.Labels = map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		p.Labels[kv[i]] = kv[i+1]
	}
	return p
}

func uid32(v uint32) *uint32 { return &v }

// mapCell compiles rules into a Cell, as the server's Combiner publishes.
func mapCell(t *testing.T, def identitymap.Default, rules ...identitymap.Rule) *identitymap.Cell {
	t.Helper()
	m, err := identitymap.Compile(identitymap.Config{TrustDomain: td, Default: def}, rules)
	require.NoError(t, err)
	return identitymap.NewCell(m)
}

// Rules of the identity map tests: shop's pods with an app label get an
// ID by app; a uid rule only the node agent can check.
var mapRules = []identitymap.Rule{
	{Name: "shop-apps", Origin: "test", SPIFFEID: "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/app/{{.PodLabels.app}}",
		Workloads: []identitymap.Selector{{Namespace: "shop", PodLabels: &metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpExists}}}}}},
	{Name: "by-uid", Origin: "test", SPIFFEID: "spiffe://{{.TrustDomain}}/uid/{{.UID}}",
		Workloads: []identitymap.Selector{{Kubernetes: true, UID: uid32(1000)}}},
}

var mapPods = []*corev1.Pod{
	pod("istio-system", "ztunnel-a", "uid-za", "ztunnel", "node-a", corev1.PodRunning),
	labelled(pod("shop", "web-1", "uid-w1", "web", "node-a", corev1.PodRunning), "app", "web"),
	labelled(pod("shop", "api-1", "uid-a1", "api", "node-b", corev1.PodRunning), "app", "api"),
	labelled(pod("shop", "old-1", "uid-o1", "old", "node-a", corev1.PodSucceeded), "app", "old"),
	pod("shop", "tool-1", "uid-t1", "tool", "node-a", corev1.PodRunning),
	pod("misc", "plain-1", "uid-p1", "plain", "node-a", corev1.PodRunning),
}

func TestAuthorizeImpersonationWithIdentityMap(t *testing.T) {
	a, _ := startAuthorizer(t, Config{IdentityMap: mapCell(t, identitymap.DefaultIstio, mapRules...)}, mapPods...)
	zt := ztunnel("ztunnel-a", "uid-za")
	app := func(name string) spiffeid.ID { return spiffeid.RequireFromSegments(td, "ns", "shop", "app", name) }
	tests := []struct {
		name   string
		caller authn.Identity
		target spiffeid.ID
		err    error
		msg    string
	}{
		{"a rule's ID for a pod on the node", zt, app("web"), nil, ""},
		{"a rule's ID for a pod on another node", zt, app("api"), ErrNotAuthorized, "gives spiffe://example.org/ns/shop/app/api to none of the 4 running pods on node node-a"},
		{"no pod on the node has the label", zt, app("checkout"), ErrNotAuthorized, "to none of"},
		{"a finished pod's", zt, app("old"), ErrNotAuthorized, "to none of"},
		{"the Istio form of a pod a rule maps elsewhere", zt, id("shop", "web"), ErrNotAuthorized, "to none of"},
		{"the default for a pod no rule selects", zt, id("misc", "plain"), nil, ""},
		{"the default for a shop pod without the label", zt, id("shop", "tool"), nil, ""},
		{"a rule only the agent can check", zt, spiffeid.RequireFromPath(td, "/uid/1000"), ErrNotAuthorized, "to none of"},
		{"another trust domain", zt, spiffeid.RequireFromString("spiffe://other.example/ns/shop/app/web"), ErrNotAuthorized, "not of trust domain"},
		{"still only node accounts", authn.Identity{ID: id("shop", "web"), Method: authn.MethodKubernetesJWT,
			Pod: authn.PodRef{Namespace: "shop", Name: "web-1", UID: "uid-w1"}}, app("web"), ErrNotAuthorized, "not a trusted node account"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := a.AuthorizeImpersonation(context.Background(), tt.caller, tt.target)
			if tt.err == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tt.err)
			assert.ErrorContains(t, err, tt.msg)
		})
	}
}

// Default none: only rules give identities, the Istio form of a pod no
// rule selects included.
func TestAuthorizeImpersonationIdentityMapDefaultNone(t *testing.T) {
	a, _ := startAuthorizer(t, Config{IdentityMap: mapCell(t, identitymap.DefaultNone, mapRules...)}, mapPods...)
	zt := ztunnel("ztunnel-a", "uid-za")
	require.NoError(t, a.AuthorizeImpersonation(context.Background(), zt, spiffeid.RequireFromSegments(td, "ns", "shop", "app", "web")))
	assert.ErrorIs(t, a.AuthorizeImpersonation(context.Background(), zt, id("misc", "plain")), ErrNotAuthorized)
	assert.ErrorIs(t, a.AuthorizeImpersonation(context.Background(), zt, id("shop", "tool")), ErrNotAuthorized)
}

// Until the map holds every source, and while none is published,
// requests are refused as unavailable: never decided on part of the
// rules.
func TestAuthorizeImpersonationIdentityMapNotReady(t *testing.T) {
	var ready atomic.Bool
	cell := identitymap.NewCell(nil)
	a, _ := startAuthorizer(t, Config{IdentityMap: cell, MapReady: ready.Load}, mapPods...)
	zt := ztunnel("ztunnel-a", "uid-za")
	assert.ErrorIs(t, a.AuthorizeImpersonation(context.Background(), zt, id("misc", "plain")), authn.ErrUnavailable)
	ready.Store(true)
	assert.ErrorIs(t, a.AuthorizeImpersonation(context.Background(), zt, id("misc", "plain")), authn.ErrUnavailable)
	m, err := identitymap.Compile(identitymap.Config{TrustDomain: td}, mapRules)
	require.NoError(t, err)
	cell.Set(m)
	require.NoError(t, a.AuthorizeImpersonation(context.Background(), zt, id("misc", "plain")))
}

// Without a map, labels change nothing: the Istio form only, as before.
func TestAuthorizeImpersonationWithoutIdentityMap(t *testing.T) {
	a, _ := startAuthorizer(t, Config{}, mapPods...)
	zt := ztunnel("ztunnel-a", "uid-za")
	require.NoError(t, a.AuthorizeImpersonation(context.Background(), zt, id("shop", "web")))
	assert.ErrorContains(t, a.AuthorizeImpersonation(context.Background(), zt, spiffeid.RequireFromSegments(td, "ns", "shop", "app", "web")),
		"is not spiffe://example.org/ns/<namespace>/sa/<service account>")
}

// The informer keeps what the map reads: labels, and not the rest.
func TestTrimPodKeepsLabels(t *testing.T) {
	p := labelled(pod("shop", "web-1", "uid-w1", "web", "node-a", corev1.PodRunning), "app", "web")
	p.Annotations = map[string]string{"big": "x"}
	p.Spec.Containers = []corev1.Container{{Name: "c", Image: "img"}}
	got, err := trimPod(p)
	require.NoError(t, err)
	tp := got.(*corev1.Pod)
	assert.Equal(t, map[string]string{"app": "web"}, tp.Labels)
	assert.Nil(t, tp.Annotations)
	assert.Nil(t, tp.Spec.Containers)
}

// Two pods of one service account on the node get one ID but each its own
// DNS name: a request may carry exactly the names of one of them, never a
// mix, a part or more of them, and names on another node do not count.
func TestAuthorizeImpersonationNames(t *testing.T) {
	podNames := identitymap.Rule{Name: "pod-names", Origin: "test", SPIFFEID: "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/sa/{{.ServiceAccount}}",
		DNSNames:  []string{"{{.PodName}}.{{.Namespace}}.svc"},
		Workloads: []identitymap.Selector{{Namespace: "shop", ServiceAccount: "web"}}}
	a, _ := startAuthorizer(t, Config{IdentityMap: mapCell(t, identitymap.DefaultIstio, podNames)},
		pod("istio-system", "ztunnel-a", "uid-za", "ztunnel", "node-a", corev1.PodRunning),
		pod("shop", "web-1", "uid-w1", "web", "node-a", corev1.PodRunning),
		pod("shop", "web-2", "uid-w2", "web", "node-a", corev1.PodRunning),
		pod("shop", "web-3", "uid-w3", "web", "node-b", corev1.PodRunning),
		pod("shop", "api-1", "uid-a1", "api", "node-a", corev1.PodRunning),
	)
	zt := ztunnel("ztunnel-a", "uid-za")
	web := id("shop", "web")
	for _, tt := range []struct {
		name   string
		target spiffeid.ID
		names  []string
		msg    string // "" grants
	}{
		{"the names of one pod", web, []string{"web-1.shop.svc"}, ""},
		{"the names of the other", web, []string{"web-2.shop.svc"}, ""},
		{"the mix of both", web, []string{"web-1.shop.svc", "web-2.shop.svc"}, "2 of them get that ID with other names"},
		{"a name the map gives no pod", web, []string{"db.shop.svc"}, "with exactly the DNS names"},
		{"a superset", web, []string{"web-1.shop.svc", "x.shop.svc"}, "with exactly the DNS names"},
		{"none, where the pods have some", web, nil, "with exactly the DNS names"},
		{"a pod's names on another node", web, []string{"web-3.shop.svc"}, "with exactly the DNS names"},
		{"another ID with a pod's names", id("shop", "api"), []string{"web-1.shop.svc"}, "to none of the 4 running pods on node node-a"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := a.AuthorizeImpersonationNames(t.Context(), zt, tt.target, tt.names)
			if tt.msg == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrNotAuthorized)
			assert.ErrorContains(t, err, tt.msg)
		})
	}
	// The names of a pod the map gives none: exactly none.
	require.NoError(t, a.AuthorizeImpersonationNames(t.Context(), zt, id("shop", "api"), nil))
	// The ID alone is still decided as before, whatever the names.
	require.NoError(t, a.AuthorizeImpersonation(t.Context(), zt, web))
	// Still only node accounts.
	caller := authn.Identity{ID: web, Method: authn.MethodKubernetesJWT, Pod: authn.PodRef{Namespace: "shop", Name: "web-1", UID: "uid-w1"}}
	assert.ErrorContains(t, a.AuthorizeImpersonationNames(t.Context(), caller, web, []string{"web-1.shop.svc"}), "not a trusted node account")
}

// Without an identity map no DNS name is granted: the Istio form has
// none, and the error says how to get them.
func TestAuthorizeImpersonationNamesWithoutIdentityMap(t *testing.T) {
	a, _ := startAuthorizer(t, Config{}, mapPods...)
	err := a.AuthorizeImpersonationNames(t.Context(), ztunnel("ztunnel-a", "uid-za"), id("shop", "web"), []string{"web.shop.svc"})
	require.ErrorIs(t, err, ErrNotAuthorized)
	assert.ErrorContains(t, err, "this server has no identity map (--identity-map)")
}
