//go:build istioauthz

package istiotest

import (
	"strings"
	"testing"

	rbacpb "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authzmodel "istio.io/istio/pilot/pkg/security/authz/model"
	"istio.io/istio/pilot/pkg/security/trustdomain"
)

// TestIstioDocFederatedPrincipal: the guide's AuthorizationPolicy is a
// valid Istio AuthorizationPolicy, and Istio's own RBAC generator
// (pilot/pkg/security/authz/model, with the mesh's trust domain of the
// guide) matches its principal of the federated trust domain as exactly
// that SPIFFE ID, not rewritten into the mesh's trust domain.
func TestIstioDocFederatedPrincipal(t *testing.T) {
	blocks := readDocBlocks(t)
	name, policy := docAuthorizationPolicy(t, blocks)
	meshTD := lookup(t, docValues(t, blocks, "istio-node-values.yaml"), "meshConfig.trustDomain").(string)

	var principals []string
	for _, r := range policy.GetRules() {
		m, err := authzmodel.New(name, r)
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
