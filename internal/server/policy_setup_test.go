package server

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/audit"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

func policyServer(t *testing.T, mutate func(*Config)) Config {
	t.Helper()
	o := baseServerOptions("example.org", t.TempDir())
	o.Policy = PolicyConfig{Default: "allow", Poll: time.Hour}
	if mutate != nil {
		mutate(&o)
	}
	return o
}

// Without any policy the server says so once, at Warn, with how to add
// one; the audit log records the start's (empty) policy.
func TestPolicyNoneWarnsAtStart(t *testing.T) {
	o := policyServer(t, nil)
	_, banner, _ := launchServer(t, o)
	rec := servertest.LogRecord(banner, "no trust policy: every workload receives every federated trust domain")
	require.NotNil(t, rec, banner)
	assert.Equal(t, "WARN", rec["level"])
	assert.Contains(t, rec["how"], "--trust-policy FILE")
	assert.Equal(t, 1, servertest.CountRecords(banner, "no trust policy: every workload receives every federated trust domain"))
	evs := servertest.PolicyEvents(t, filepath.Join(o.DataDir, "audit.jsonl"))
	require.Len(t, evs, 1)
	assert.Equal(t, "trust_policy_changed", evs[0].Event)
	assert.Equal(t, &audit.PolicyChange{Source: "start", Default: "allow"}, evs[0].Policy)
}

// A policy file and the --config file's trustPolicy section are read at
// start; the log names the rule count and the default.
func TestPolicyFromFileAndConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(`trustPolicy:
  rules:
  - name: ops
    workloads: [{namespace: ops}]
    trustDomains: [{name: partner.example}]
`), 0o600))
	o := policyServer(t, func(o *Config) {
		o.Policy.File = servertest.WritePolicy(t, dir, servertest.GoodPolicy)
		o.ConfigPath = cfg
	})
	require.NoError(t, loadServerConfig(serverCmdFlags(), &o, func(string) string { return "" }))
	admin, banner, _ := launchServer(t, o)
	rec := servertest.LogRecord(banner, "trust policy in force")
	require.NotNil(t, rec, banner)
	assert.EqualValues(t, 2, rec["rules"])
	assert.Equal(t, "deny", rec["default"], "the file's deny is stricter than the flag's allow")
	assert.Nil(t, servertest.LogRecord(banner, "no trust policy: every workload receives every federated trust domain"))

	snap := servertest.GetSnapshot(t, "http://"+admin)
	require.NotNil(t, snap.TrustPolicy)
	assert.Equal(t, 2, snap.TrustPolicy.Rules)
	assert.Equal(t, "deny", snap.TrustPolicy.Default)
	require.Len(t, snap.TrustPolicy.Sources, 2)
	assert.Equal(t, "config:"+cfg, snap.TrustPolicy.Sources[0].Source)
	assert.Equal(t, "file:"+o.Policy.File, snap.TrustPolicy.Sources[1].Source)

	evs := servertest.PolicyEvents(t, filepath.Join(o.DataDir, "audit.jsonl"))
	require.Len(t, evs, 1)
	assert.Equal(t, []string{"ops", "payments-to-partner"}, evs[0].Policy.RulesAdded)
	assert.Equal(t, "start", evs[0].Policy.Source)
}

// A bad policy at start stops the server with the file, line and rule.
func TestPolicyBadAtStart(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(t *testing.T, o *Config)
		want   []string
	}{
		{"bad file", func(t *testing.T, o *Config) {
			o.Policy.File = servertest.WritePolicy(t, t.TempDir(), servertest.BadPolicy)
		},
			[]string{"--trust-policy", "policy.yaml:7", `rule 2 "broken"`, "no workloads"}},
		{"missing file", func(t *testing.T, o *Config) { o.Policy.File = filepath.Join(t.TempDir(), "nope.yaml") },
			[]string{"--trust-policy", "nope.yaml"}},
		{"bad default", func(t *testing.T, o *Config) { o.Policy.Default = "maybe" },
			[]string{"--trust-policy-default", `"maybe"`}},
		{"bad config section", func(t *testing.T, o *Config) {
			cfg := filepath.Join(t.TempDir(), "config.yaml")
			require.NoError(t, os.WriteFile(cfg, []byte("trust-domain: example.org\ntrustPolicy:\n  rules:\n  - name: x\n    workloads: [{spiffeID: 'spiffe://example.org/ns/*/sa'}]\n    trustDomains: [{name: p.example}]\n"), 0o600))
			o.ConfigPath = cfg
			require.NoError(t, loadServerConfig(serverCmdFlags(), o, func(string) string { return "" }))
		}, []string{"config.yaml:5", `rule 1 "x"`, "trustPolicy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := policyServer(t, nil)
			tc.mutate(t, &o)
			e, _, _ := testEnv(t, o.LogFormat)
			err := runServer(t.Context(), e, o, nil)
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}
