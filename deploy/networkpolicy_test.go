package deploy

import (
	"net/url"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// overlayObjects renders dir and returns its NetworkPolicy, the server's
// config and every object.
func overlayObjects(t *testing.T, dir string) (*networkingv1.NetworkPolicy, map[string]any, []*unstructured.Unstructured) {
	t.Helper()
	objs := kubetest.DecodeObjects(t, kubetest.OfflineKubectl(t).Must(nil, "kustomize", dir))
	var np *networkingv1.NetworkPolicy
	var cfg map[string]any
	for _, o := range objs {
		switch {
		case o.GetKind() == "NetworkPolicy":
			np = &networkingv1.NetworkPolicy{}
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, np))
		case o.GetKind() == "ConfigMap":
			if raw, found, _ := unstructured.NestedString(o.Object, "data", "config.yaml"); found {
				require.NoError(t, yaml.Unmarshal([]byte(raw), &cfg))
			}
		}
	}
	require.NotNil(t, np, "%s: a NetworkPolicy", dir)
	require.NotNil(t, cfg, "%s: the server's config", dir)
	return np, cfg, objs
}

// allows reports whether a rule of the policy lets TCP (or proto) to port
// through to any address.
func allows(rules []networkingv1.NetworkPolicyEgressRule, proto string, port int) bool {
	for _, r := range rules {
		if len(r.To) > 0 {
			continue
		}
		for _, p := range r.Ports {
			got := "TCP"
			if p.Protocol != nil {
				got = string(*p.Protocol)
			}
			if got == proto && p.Port != nil && p.Port.Type == intstr.Int && p.Port.IntValue() == port {
				return true
			}
		}
	}
	return false
}

// The NetworkPolicy of every overlay lets in what the server listens on
// (the admin port only from the monitoring namespace) and lets out what it
// dials: DNS, the API server, and every peer's bundle endpoint the
// overlay federates with (README: "a NetworkPolicy", ingress and egress).
func TestNetworkPolicyFollowsServer(t *testing.T) {
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			np, cfg, objs := overlayObjects(t, dir)
			assert.ElementsMatch(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}, np.Spec.PolicyTypes)

			ports := map[int]*networkingv1.NetworkPolicyIngressRule{}
			for i, r := range np.Spec.Ingress {
				for _, p := range r.Ports {
					ports[p.Port.IntValue()] = &np.Spec.Ingress[i]
				}
			}
			for _, key := range []string{"bundle-listen", "grpc-listen", "admin-listen"} {
				_, p, err := splitHostPort(cfg[key].(string))
				require.NoError(t, err, key)
				require.NotNil(t, ports[p], "%s (%d) is let in", key, p)
				if key == "admin-listen" {
					require.Len(t, ports[p].From, 1, "the admin port only from the monitoring namespace")
					assert.Equal(t, map[string]string{"kubernetes.io/metadata.name": "monitoring"}, ports[p].From[0].NamespaceSelector.MatchLabels)
				} else {
					assert.Empty(t, ports[p].From, "%s is open to peers and workloads", key)
				}
			}

			egress := np.Spec.Egress
			assert.True(t, allows(egress, "UDP", 53) && allows(egress, "TCP", 53), "DNS")
			assert.True(t, allows(egress, "TCP", 443) && allows(egress, "TCP", 6443), "the API server, as its Service or its endpoints")
			for _, u := range peerEndpoints(t, cfg, objs) {
				port := 443
				if p := u.Port(); p != "" {
					port, _ = strconv.Atoi(p)
				}
				assert.True(t, allows(egress, "TCP", port), "peer bundle endpoint %s", u)
			}
		})
	}
}

// peerEndpoints are the bundle endpoints an overlay federates with: its
// config's peers and its ClusterFederatedTrustDomains.
func peerEndpoints(t *testing.T, cfg map[string]any, objs []*unstructured.Unstructured) []*url.URL {
	t.Helper()
	var raw []string
	peers, _ := cfg["federation"].([]any)
	for _, p := range peers {
		raw = append(raw, p.(map[string]any)["bundleEndpointURL"].(string))
	}
	for _, o := range objs {
		if o.GetKind() == "ClusterFederatedTrustDomain" {
			s, _, _ := unstructured.NestedString(o.Object, "spec", "bundleEndpointURL")
			raw = append(raw, s)
		}
	}
	var out []*url.URL
	for _, s := range raw {
		u, err := url.Parse(s)
		require.NoError(t, err)
		out = append(out, u)
	}
	return out
}

func splitHostPort(addr string) (string, int, error) {
	u, err := url.Parse("//" + addr)
	if err != nil {
		return "", 0, err
	}
	p, err := strconv.Atoi(u.Port())
	return u.Hostname(), p, err
}
