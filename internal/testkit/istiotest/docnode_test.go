package istiotest

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	securityv1 "istio.io/api/security/v1"
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

// TestIstioDocFederatedPolicy: the guide's AuthorizationPolicy is a valid
// Istio AuthorizationPolicy (istio.io/api's own message) naming peers of a
// federated trust domain, not the mesh's. That Istio's RBAC generator
// matches them as exactly those SPIFFE IDs is TestIstioDocFederatedPrincipal,
// in make istio-tests (tag istioauthz: it compiles a thousand of istiod's
// packages, which make test's short run leaves out).
func TestIstioDocFederatedPolicy(t *testing.T) {
	blocks := readDocBlocks(t)
	_, policy := docAuthorizationPolicy(t, blocks)
	meshTD := lookup(t, docValues(t, blocks, "istio-node-values.yaml"), "meshConfig.trustDomain").(string)
	var principals []string
	for _, r := range policy.GetRules() {
		for _, from := range r.GetFrom() {
			principals = append(principals, from.GetSource().GetPrincipals()...)
		}
	}
	require.NotEmpty(t, principals, "the guide's policy names no principal")
	for _, p := range principals {
		id, err := spiffeid.FromString("spiffe://" + p)
		require.NoError(t, err, "principal %q is not a SPIFFE ID without its scheme", p)
		assert.NotEqual(t, meshTD, id.TrustDomain().Name(), "the guide's example is of a federated peer")
	}
}

// docAuthorizationPolicy is the guide's authz-federated.yaml: its name and
// its spec, parsed strictly as Istio's message.
func docAuthorizationPolicy(t *testing.T, blocks map[string]docBlock) (types.NamespacedName, *securityv1.AuthorizationPolicy) {
	t.Helper()
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
	return types.NamespacedName{Namespace: meta.Namespace, Name: meta.Name}, policy
}
