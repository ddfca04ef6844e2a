package audit

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

func TestIdentityMapFindings(t *testing.T) {
	cases := []struct {
		name string
		im   *api.IdentityMap
		want []found
	}{
		{"no identity map: not judged", nil, []found{}},
		{"rules without trouble", &api.IdentityMap{Default: "istio", Rules: []api.IdentityRule{{Name: "a", ServerChecks: true}}}, []found{}},
		{"conflict", &api.IdentityMap{Conflicts: []string{`rule "a" (crd:a) and rule "b" (crd:b) may select the same workload`}},
			[]found{{api.SeverityWarning, CodeIdentityConflict, ""}}},
		{"empty conflict message", &api.IdentityMap{Conflicts: []string{" "}}, []found{{api.SeverityWarning, CodeIdentityConflict, ""}}},
		{"agent-only rule", &api.IdentityMap{AgentOnly: []string{`rule "by-uid" (crd:by-uid) needs uid`}},
			[]found{{api.SeverityWarning, CodeIdentityAgentOnly, ""}}},
		{"refused source", &api.IdentityMap{Sources: []api.PolicySource{{Source: "crd", LastError: "same name"}}},
			[]found{{api.SeverityWarning, CodeIdentityRejected, ""}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := Findings(api.Snapshot{Time: now, TrustDomain: "east.example", IdentityMap: tc.im})
			assert.Equal(t, tc.want, summary(fs))
			for _, f := range fs {
				assert.NotEmpty(t, f.Message)
				assert.NotEmpty(t, f.Fix)
			}
		})
	}
	fs := Findings(api.Snapshot{Time: now, IdentityMap: &api.IdentityMap{Conflicts: []string{"rule a and rule b conflict"}}})
	if assert.Len(t, fs, 1) {
		assert.Equal(t, "rule a and rule b conflict", fs[0].Message)
		assert.Contains(t, fs[0].Fix, "trustbridge identity explain")
	}
}
