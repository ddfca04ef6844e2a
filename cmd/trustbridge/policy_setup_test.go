package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

func policyServer(t *testing.T, mutate func(*server.Config)) server.Config {
	t.Helper()
	o := baseServerOptions("example.org", t.TempDir())
	o.Policy = server.PolicyConfig{Default: "allow", Poll: time.Hour}
	if mutate != nil {
		mutate(&o)
	}
	return o
}

// SIGHUP re-reads the file: a good change is applied and audited with
// the rules added, removed and changed; a bad one keeps the last good
// policy, is logged, counted and audited as rejected; the chain verifies.
func TestPolicyReload(t *testing.T) {
	dir := t.TempDir()
	path := servertest.WritePolicy(t, dir, servertest.GoodPolicy)
	o := policyServer(t, func(o *server.Config) { o.Policy.File = path })
	admin, hup, logs := launchReloadable(t, o)

	require.NoError(t, os.WriteFile(path, []byte(servertest.BadPolicy), 0o600))
	servertest.HUPAndWait(t, hup, logs, "trust policy file refused; keeping the last good rules", 1)
	snap := servertest.GetSnapshot(t, "http://"+admin)
	assert.Equal(t, 1, snap.TrustPolicy.Rules, "the last good policy")
	assert.Equal(t, "deny", snap.TrustPolicy.Default)
	require.Len(t, snap.TrustPolicy.Sources, 1)
	assert.Contains(t, snap.TrustPolicy.Sources[0].LastError, `rule 2 "broken"`)
	_, metrics := servertest.Get(t, "http://"+admin+"/metrics")
	assert.Contains(t, metrics, `trustbridge_trust_policy_reloads_total{result="error",source="file:`+path+`"} 1`)

	edited := strings.Replace(servertest.GoodPolicy, "ns/billing/sa/api", "ns/billing/sa/web", 1) + `- name: ops
  workloads: [{namespace: ops}]
  trustDomains: [{name: partner.example}]
`
	require.NoError(t, os.WriteFile(path, []byte(edited), 0o600))
	servertest.HUPAndWait(t, hup, logs, "trust policy changed", 1)
	snap = servertest.GetSnapshot(t, "http://"+admin)
	assert.Equal(t, 2, snap.TrustPolicy.Rules)
	assert.Empty(t, snap.TrustPolicy.Sources[0].LastError)

	evs := servertest.PolicyEvents(t, filepath.Join(o.DataDir, "audit.jsonl"))
	require.Len(t, evs, 3)
	assert.Equal(t, "start", evs[0].Policy.Source)
	assert.Equal(t, "trust_policy_rejected", evs[1].Event)
	assert.Contains(t, evs[1].Reason, `rule 2 "broken"`)
	assert.Equal(t, evs[0].Policy.DigestAfter, evs[1].Policy.DigestBefore, "the policy in force when refused")
	assert.Equal(t, evs[1].Policy.DigestBefore, evs[1].Policy.DigestAfter, "refused: the policy in force is unchanged, not none")
	assert.Equal(t, "trust_policy_changed", evs[2].Event)
	assert.Equal(t, "file:"+path, evs[2].Policy.Source)
	assert.Equal(t, []string{"ops"}, evs[2].Policy.RulesAdded)
	assert.Equal(t, []string{"payments-to-partner"}, evs[2].Policy.RulesChanged)
	assert.Equal(t, evs[0].Policy.DigestAfter, evs[2].Policy.DigestBefore)
	assert.NotEqual(t, evs[2].Policy.DigestBefore, evs[2].Policy.DigestAfter)
	assert.Equal(t, evs[2].Policy.DigestAfter, snap.TrustPolicy.TextDigest, "the snapshot shows the digest the audit log recorded")

	out, stderr, code := runCLI(t, "", "audit", "log", "verify", filepath.Join(o.DataDir, "audit.jsonl"))
	assert.Equal(t, 0, code, stderr)
	assert.NotEmpty(t, out)
}
