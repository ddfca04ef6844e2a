package trustpolicy

import (
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A GovernOnly rule keeps its trust domains governed and grants them to
// nobody, under either default; it cannot select workloads.
func TestGovernOnly(t *testing.T) {
	local := spiffeid.RequireTrustDomainFromString("example.org")
	partner := spiffeid.RequireTrustDomainFromString("partner.example")
	other := spiffeid.RequireTrustDomainFromString("other.example")
	stand := Rule{Name: "clustertrustpolicy/bad", Origin: "crd:bad", GovernOnly: true,
		TrustDomains: []TrustDomainGrant{{TrustDomain: partner.Name(), Peers: []string{"not read"}}}}
	p, err := Compile(local, DefaultAllow, []Rule{stand})
	require.NoError(t, err)
	d := p.Decide(Subject{ID: spiffeid.RequireFromPath(local, "/ns/a/sa/b"), Namespace: "a", ServiceAccount: "b"})
	_, ok := d.Allows(partner)
	assert.False(t, ok, "governed, granted to nobody")
	_, ok = d.Allows(other)
	assert.True(t, ok, "ungoverned: the default")
	assert.Empty(t, d.Matched)
	assert.True(t, d.Governs(partner))

	stand.Workloads = []Selector{{Namespace: "a"}}
	_, err = Compile(local, DefaultAllow, []Rule{stand})
	assert.ErrorContains(t, err, "selects no workloads")
	stand.Workloads, stand.TrustDomains = nil, []TrustDomainGrant{{TrustDomain: local.Name()}}
	_, err = Compile(local, DefaultAllow, []Rule{stand})
	assert.ErrorContains(t, err, "local one")
}
