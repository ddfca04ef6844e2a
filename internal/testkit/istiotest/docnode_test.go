package istiotest

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	rbacpb "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	securityv1 "istio.io/api/security/v1"
	authzmodel "istio.io/istio/pilot/pkg/security/authz/model"
	"istio.io/istio/pilot/pkg/security/trustdomain"
	"istio.io/istio/pkg/security"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"
)

// injectionValues is the node agent's istiod values, relative to this
// package.
const injectionValues = repoRoot + "/deploy/agent/istio-injection.yaml"

// TestIstioDocNodeAgent: the guide's istiod values for topology C apply,
// to every injected pod, a template of deploy/agent/istio-injection.yaml
// that mounts a volume in istio-proxy at the directory Istio's agent
// looks for its SDS socket in (security.WorkloadIdentityPath, from /, the
// proxy's working directory), and name trustbridge's trust domain.
func TestIstioDocNodeAgent(t *testing.T) {
	blocks := readDocBlocks(t)
	values := docValues(t, blocks, "istio-node-values.yaml")
	defaults := lookup(t, values, "sidecarInjectorWebhook.defaultTemplates").([]any)
	require.Contains(t, defaults, "sidecar", "defaultTemplates replaces the injector's default: keep sidecar")

	b, err := os.ReadFile(injectionValues)
	require.NoError(t, err)
	var injection map[string]any
	require.NoError(t, yaml.Unmarshal(b, &injection))
	templates := lookup(t, injection, "sidecarInjectorWebhook.templates").(map[string]any)
	socketDir := "/" + strings.TrimPrefix(security.WorkloadIdentityPath, "./")
	for _, name := range defaults {
		if name == "sidecar" {
			continue
		}
		tmpl, ok := templates[name.(string)]
		require.True(t, ok, "defaultTemplates names %s, which %s does not define", name, injectionValues)
		assert.Contains(t, proxyMountPaths(t, tmpl.(string)), socketDir,
			"template %s does not mount the node agent's socket directory where Istio's agent looks", name)
	}
	for name, tmpl := range templates {
		assert.Contains(t, proxyMountPaths(t, tmpl.(string)), socketDir, "template %s of %s", name, injectionValues)
	}

	var cfg struct {
		TrustDomain string `json:"trust-domain"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(block(t, blocks, "trustbridge-config.yaml", "yaml").body), &cfg))
	assert.Equal(t, cfg.TrustDomain, lookup(t, values, "meshConfig.trustDomain"), "the mesh's trust domain is trustbridge's")
}

// proxyMountPaths are the mount paths of istio-proxy in an injection
// template.
func proxyMountPaths(t *testing.T, tmpl string) []string {
	t.Helper()
	var pod struct {
		Spec struct {
			Containers []struct {
				Name         string `json:"name"`
				VolumeMounts []struct {
					MountPath string `json:"mountPath"`
				} `json:"volumeMounts"`
			} `json:"containers"`
		} `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(tmpl), &pod))
	var paths []string
	for _, c := range pod.Spec.Containers {
		if c.Name != "istio-proxy" {
			continue
		}
		for _, m := range c.VolumeMounts {
			paths = append(paths, m.MountPath)
		}
	}
	return paths
}

// TestIstioDocFederatedPrincipal: the guide's AuthorizationPolicy is a
// valid Istio AuthorizationPolicy, and Istio's own RBAC generator
// (pilot/pkg/security/authz/model, with the mesh's trust domain of the
// guide) matches its principal of the federated trust domain as exactly
// that SPIFFE ID, not rewritten into the mesh's trust domain.
func TestIstioDocFederatedPrincipal(t *testing.T) {
	blocks := readDocBlocks(t)
	var obj struct {
		APIVersion string          `json:"apiVersion"`
		Kind       string          `json:"kind"`
		Metadata   json.RawMessage `json:"metadata"`
		Spec       json.RawMessage `json:"spec"`
	}
	require.NoError(t, yaml.UnmarshalStrict([]byte(block(t, blocks, "authz-federated.yaml", "yaml").body), &obj))
	assert.Equal(t, "security.istio.io/v1", obj.APIVersion)
	assert.Equal(t, "AuthorizationPolicy", obj.Kind)
	var meta struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	}
	require.NoError(t, json.Unmarshal(obj.Metadata, &meta))
	policy := &securityv1.AuthorizationPolicy{}
	require.NoError(t, protojson.Unmarshal(obj.Spec, policy), "spec is not a valid AuthorizationPolicy")
	meshTD := lookup(t, docValues(t, blocks, "istio-node-values.yaml"), "meshConfig.trustDomain").(string)

	var principals []string
	for _, r := range policy.GetRules() {
		m, err := authzmodel.New(types.NamespacedName{Namespace: meta.Namespace, Name: meta.Name}, r)
		require.NoError(t, err)
		m.MigrateTrustDomain(trustdomain.NewBundle(meshTD, nil))
		p, err := m.Generate(false, true, rbacpb.RBAC_ALLOW)
		require.NoError(t, err)
		principals = append(principals, authenticatedPrincipals(p)...)
		for _, from := range r.GetFrom() {
			for _, want := range from.GetSource().GetPrincipals() {
				require.False(t, strings.HasPrefix(want, meshTD+"/"), "the guide's example is of a federated peer")
				assert.Contains(t, principals, "spiffe://"+want, "Istio does not match principal %s as that SPIFFE ID", want)
			}
		}
	}
	require.NotEmpty(t, principals)
	for _, p := range principals {
		assert.False(t, strings.HasPrefix(p, "spiffe://"+meshTD+"/"), "Istio rewrote a federated principal into the mesh's trust domain: %s", p)
	}
}

// authenticatedPrincipals are the exact URI SAN matches of a generated
// RBAC policy's authenticated principals.
func authenticatedPrincipals(p *rbacpb.Policy) []string {
	var out []string
	var walk func(*rbacpb.Principal)
	walk = func(pr *rbacpb.Principal) {
		switch id := pr.GetIdentifier().(type) {
		case *rbacpb.Principal_AndIds:
			for _, x := range id.AndIds.GetIds() {
				walk(x)
			}
		case *rbacpb.Principal_OrIds:
			for _, x := range id.OrIds.GetIds() {
				walk(x)
			}
		case *rbacpb.Principal_Authenticated_:
			if e := id.Authenticated.GetPrincipalName().GetExact(); e != "" {
				out = append(out, e)
			}
		}
	}
	for _, pr := range p.GetPrincipals() {
		walk(pr)
	}
	return out
}
