package identitymap

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExplain(t *testing.T) {
	a := rule("a", istioTmpl, Selector{Namespace: "web"}, Selector{Namespace: "pay", ServiceAccount: "api"})
	a.TTL, a.DNSNames = time.Hour, []string{"{{.ServiceAccount}}.{{.Namespace}}.svc"}
	b := rule("b", appTmpl, Selector{Kubernetes: true, UID: u32(1000)})
	m := compile(t, "", a, b)

	e := m.Explain(pod("pay", "api", map[string]string{"app": "web"}))
	assert.Equal(t, BecauseConflict, e.Because)
	assert.Contains(t, e.Error, "rules give this workload different SPIFFE IDs")
	assert.Empty(t, e.SPIFFEID)
	require.Len(t, e.Matched, 2)
	assert.Equal(t, MatchResult{Rule: "a", Origin: "test:a", Selector: 1, Fields: []string{"namespace", "serviceAccount"},
		SPIFFEID: "spiffe://example.org/ns/pay/sa/api", DNSNames: []string{"api.pay.svc"}}, e.Matched[0])
	assert.Equal(t, "spiffe://example.org/app/web", e.Matched[1].SPIFFEID)
	assert.Equal(t, []string{"kubernetes", "uid"}, e.Matched[1].Fields)
	assert.Equal(t, 2, e.Rules)

	e = m.Explain(Workload{Kubernetes: true, Namespace: "pay", ServiceAccount: "api"})
	assert.Equal(t, "rule a (test:a)", e.Because)
	assert.Equal(t, "spiffe://example.org/ns/pay/sa/api", e.SPIFFEID)
	assert.Equal(t, "1h0m0s", e.TTL)
	assert.Empty(t, e.Error)

	e = m.Explain(pod("db", "x", nil))
	assert.Equal(t, "rules b (test:b)", "rules "+e.Matched[0].Rule+" ("+e.Matched[0].Origin+")")
	assert.Equal(t, BecauseFacts, e.Because)
	assert.Contains(t, e.Matched[0].Error, `no label "app"`)

	e = m.Explain(Workload{Kubernetes: true, Namespace: "db", ServiceAccount: "x"})
	assert.Equal(t, BecauseDefault, e.Because)
	assert.Equal(t, "spiffe://example.org/ns/db/sa/x", e.SPIFFEID)
	assert.Empty(t, e.Matched)

	e = compile(t, DefaultNone).Explain(Workload{Unix: true})
	assert.Equal(t, BecauseNoMatch, e.Because)
	assert.Contains(t, e.Error, "no rule is configured")

	// The JSON shape policy explain and the status page print.
	b2 := rule("c", istioTmpl, Selector{Kubernetes: true})
	out, err := json.Marshal(compile(t, "", b2).Explain(Workload{Kubernetes: true, Namespace: "n", ServiceAccount: "s"}))
	require.NoError(t, err)
	assert.JSONEq(t, `{"workload":{"kubernetes":true,"namespace":"n","serviceAccount":"s","unix":false,"uid":0,"gid":0},
		"default":"istio","rules":1,"matched":[{"rule":"c","origin":"test:c","selector":0,"fields":["kubernetes"],
		"spiffeID":"spiffe://example.org/ns/n/sa/s"}],"spiffeID":"spiffe://example.org/ns/n/sa/s","because":"rule c (test:c)"}`, string(out))
}
