package identitymap

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAgentOnly(t *testing.T) {
	uid := uint32(1000)
	rules := []Rule{
		{Name: "pods", Origin: "test", Workloads: []Selector{{Namespace: "pay"}},
			SPIFFEID: "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/app/{{.PodLabels.app}}"},
		{Name: "by-uid", Origin: "test", Workloads: []Selector{{Kubernetes: true, UID: &uid}},
			SPIFFEID: "spiffe://{{.TrustDomain}}/uid/{{.UID}}"},
		{Name: "by-container", Origin: "test", Workloads: []Selector{{Namespace: "web"}},
			SPIFFEID: "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/c/{{.ContainerName}}"},
	}
	m, err := Compile(Config{TrustDomain: localTD}, rules)
	require.NoError(t, err)
	got := m.AgentOnly()
	require.Len(t, got, 2)
	assert.Equal(t, "by-uid", got[0].Name)
	assert.Equal(t, []string{"uid", "{{.UID}}"}, got[0].Needs)
	assert.Equal(t, "by-container", got[1].Name)
	assert.Equal(t, []string{"{{.ContainerName}}"}, got[1].Needs)
	assert.Contains(t, got[1].Message, "never grants")

	// The server's facts of a pod: a uid rule does not select it, a
	// container template cannot be filled.
	w := ServerFacts("web", "api", "web-1", "u1", "node-a", nil)
	_, err = m.Identify(w)
	assert.ErrorIs(t, err, ErrFacts)
	w = ServerFacts("other", "api", "o-1", "u2", "node-a", nil)
	ident, err := m.Identify(w)
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/ns/other/sa/api", ident.ID.String())
	assert.Nil(t, (*Map)(nil).AgentOnly())
}
