package audit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// A tainted authority of the local CA is critical until it is revoked;
// once revoked it is judged no more (not even its expiry).
func TestTaintedAuthorityFindings(t *testing.T) {
	tainted := now.Add(-time.Hour)
	withState := func(a api.Authority, id, state string, taintedAt *time.Time) api.Authority {
		a.ID, a.State, a.TaintedAt = id, state, taintedAt
		return a
	}
	active := withState(root(t, "east.example", testca.Options{}), "01", "active", nil)
	old := withState(root(t, "east.example", testca.Options{}), "0a", "retired", &tainted)
	jwtKey := api.Authority{Kind: api.KindJWT, KeyID: "k-old", SHA256: "dd", State: "retired", TaintedAt: &tainted}
	expiring := withState(root(t, "east.example", testca.Options{NotAfter: now.AddDate(0, 0, 2)}), "0b", "revoked", &tainted)
	peerRoot := withState(root(t, "west.example", testca.Options{}), "", "", &tainted)

	cases := []struct {
		name string
		tds  []api.TrustDomain
		want []found
	}{
		{"tainted root", []api.TrustDomain{local(active, old)}, []found{{api.SeverityCritical, CodeAuthorityTainted, "east.example"}}},
		{"tainted JWT key", []api.TrustDomain{local(active, jwtKey)}, []found{{api.SeverityCritical, CodeAuthorityTainted, "east.example"}}},
		{"revoked, expiring", []api.TrustDomain{local(active, expiring)}, []found{}},
		{"a peer's authority is not ours to revoke", []api.TrustDomain{local(active), peer("west.example", okFed("https://w/"), peerRoot)}, []found{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := Findings(api.Snapshot{Time: now, TrustDomain: "east.example", TrustDomains: tc.tds})
			assert.Equal(t, tc.want, summary(fs))
		})
	}

	fs := Findings(api.Snapshot{Time: now, TrustDomain: "east.example", TrustDomains: []api.TrustDomain{local(active, old, jwtKey)}})
	require.Len(t, fs, 2)
	got := map[string][2]string{}
	for _, f := range fs {
		got[f.Authority] = [2]string{f.Message, f.Fix}
	}
	assert.Equal(t, [2]string{
		"root 0a of east.example has been tainted since 2026-11-22T11:00:00Z: it signs nothing more and clients re-issue what it signed, but it is still trusted by every workload and peer",
		"revoke it with `trustbridge ca authority revoke --x509 0a` once its workloads were re-issued (`trustbridge ca authority list` shows none in use)",
	}, got[old.SHA256])
	assert.Equal(t, "revoke it with `trustbridge ca authority revoke --jwt k-old` once its workloads were re-issued (`trustbridge ca authority list` shows none in use)", got["dd"][1])
}
