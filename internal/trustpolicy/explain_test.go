package trustpolicy

import (
	"encoding/json"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExplain(t *testing.T) {
	third := spiffeid.RequireTrustDomainFromString("third.example")
	tds := []spiffeid.TrustDomain{localTD, partnerTD, otherTD, third}
	rules := []Rule{
		rule("pay", "spiffe://example.org/ns/pay/*", "partner.example=spiffe://partner.example/api"),
		rule("pay-api", "spiffe://example.org/ns/pay/sa/api", "partner.example=spiffe://partner.example/ops/*"),
		rule("web", "spiffe://example.org/ns/web/*", "other.example"),
	}
	because := func(e Explanation) []string {
		var out []string
		for _, td := range e.TrustDomains {
			out = append(out, td.Because)
		}
		return out
	}
	sub := Subject{ID: spiffeid.RequireFromString("spiffe://example.org/ns/pay/sa/api")}

	p, err := Compile(localTD, DefaultAllow, rules)
	require.NoError(t, err)
	e := Explain(p.Decide(sub), sub, tds)
	assert.Equal(t, []string{BecauseLocal, "rules pay (test:pay), pay-api (test:pay-api)", BecauseGoverned, BecauseDefaultAllow}, because(e))
	assert.Equal(t, []bool{true, true, false, true}, []bool{e.TrustDomains[0].Trusted, e.TrustDomains[1].Trusted, e.TrustDomains[2].Trusted, e.TrustDomains[3].Trusted})
	assert.Equal(t, []string{"spiffe://partner.example/api", "spiffe://partner.example/ops/*"}, e.TrustDomains[1].Peers)
	assert.True(t, e.Policy)
	assert.Equal(t, DefaultAllow, e.Default)

	p, err = Compile(localTD, DefaultDeny, rules[2:])
	require.NoError(t, err)
	e = Explain(p.Decide(sub), sub, tds)
	assert.Equal(t, []string{BecauseLocal, BecauseDefaultDeny, BecauseGoverned, BecauseDefaultDeny}, because(e))
	assert.Equal(t, []Match{}, e.Matched)

	web := Subject{ID: spiffeid.RequireFromString("spiffe://example.org/ns/web/sa/x")}
	e = Explain(p.Decide(web), web, tds)
	assert.Equal(t, "rule web (test:web)", e.TrustDomains[2].Because)

	e = Explain(Decision{}, sub, tds)
	assert.Equal(t, []string{BecauseNoPolicy, BecauseNoPolicy, BecauseNoPolicy, BecauseNoPolicy}, because(e))
	assert.False(t, e.Policy)
	out, err := json.Marshal(e)
	require.NoError(t, err)
	assert.Contains(t, string(out), `"trustDomains":[{"trustDomain":"example.org","trusted":true,"because":"default allow (no trust policy)"}`)
}
