package audit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

func TestKeyOutsideHSM(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	own := func(kind, state, storage string) api.Authority {
		return api.Authority{Kind: kind, SHA256: kind + "-" + state + "-" + storage, KeyID: "kid1", State: state, KeyStorage: storage}
	}
	intermediate := own(api.KindX509, "active", "state")
	intermediate.Upstream = "trustbridge upstream corp:15012"
	for _, tc := range []struct {
		name       string
		requireHSM bool
		local      bool
		a          api.Authority
		want       bool
	}{
		{"active root in state", true, true, own(api.KindX509, "active", "state"), true},
		{"prepared root in state", true, true, own(api.KindX509, "prepared", "state"), true},
		{"active JWT key in state", true, true, own(api.KindJWT, "active", "state"), true},
		{"retired root in state", true, true, own(api.KindX509, "retired", "state"), false},
		{"active root in HSM", true, true, own(api.KindX509, "active", `pkcs11 token "tb" (libsofthsm2.so)`), false},
		{"no require-hsm", false, true, own(api.KindX509, "active", "state"), false},
		{"older server, no key_storage", true, true, own(api.KindX509, "active", ""), false},
		{"other trust domain", true, false, own(api.KindX509, "active", "state"), false},
		{"active intermediate in state", true, true, intermediate, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := api.Snapshot{Time: now, RequireHSM: tc.requireHSM, TrustDomains: []api.TrustDomain{
				{Name: "example.org", Local: tc.local, Authorities: []api.Authority{tc.a}},
			}}
			var got []api.Finding
			for _, f := range Findings(s) {
				if f.Code == CodeKeyOutsideHSM {
					got = append(got, f)
				}
			}
			if !tc.want {
				assert.Empty(t, got)
				return
			}
			if assert.Len(t, got, 1) {
				assert.Equal(t, api.SeverityCritical, got[0].Severity)
				assert.Equal(t, tc.a.SHA256, got[0].Authority)
				assert.Contains(t, got[0].Message, "--require-hsm")
				assert.Contains(t, got[0].Fix, "--key-manager pkcs11")
				if tc.a.Upstream != "" {
					assert.Contains(t, got[0].Message, "active intermediate "+tc.a.SHA256)
				}
			}
		})
	}
}
