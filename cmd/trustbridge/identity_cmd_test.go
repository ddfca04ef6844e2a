package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// An identity map with a rule by app label, one in conflict with it, and
// one only node agents can evaluate.
const testIdentityMap = `rules:
- name: pay-apps
  workloads:
  - namespace: pay
  spiffeID: "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/app/{{.PodLabels.app}}"
  ttl: 1h
  dnsNames: ["{{.PodLabels.app}}.{{.Namespace}}.svc"]
- name: pay-api
  workloads:
  - namespace: pay
    serviceAccount: api
  spiffeID: "spiffe://{{.TrustDomain}}/pay/{{.ServiceAccount}}"
- name: exporter
  workloads:
  - uid: 65534
    binaryPath: /usr/bin/node_exporter
  spiffeID: "spiffe://{{.TrustDomain}}/node/exporter"
`

func writeIdentityMap(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ids.yaml")
	require.NoError(t, os.WriteFile(path, []byte(testIdentityMap), 0o600))
	return path
}

// identity explain asks the running server which ID a pod gets, as text
// and JSON; the server's audit shows the map's conflicts and agent-only
// rules.
func TestIdentityExplainCommand(t *testing.T) {
	path := writeIdentityMap(t)
	o := policyServer(t, func(o *server.Config) { o.IdentityMap = server.IdentityMapConfig{File: path} })
	admin, _, _ := launchServer(t, o)

	out, stderr, code := runCLI(t, "", "identity", "explain", "--admin", "http://"+admin,
		"--namespace", "pay", "--service-account", "web", "--pod-name", "web-1", "--label", "app=checkout")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "pod pay/web-1 (service account web), labels app=checkout; default istio, 3 rules")
	assert.Contains(t, out, "selected by rule pay-apps (file:"+path+":2), workloads[0] (namespace): spiffe://example.org/ns/pay/app/checkout")
	assert.Contains(t, out, "identity: spiffe://example.org/ns/pay/app/checkout\nttl: 1h0m0s\ndns names: checkout.pay.svc\n")
	assert.Contains(t, out, `conflict: rule "pay-apps"`)
	assert.Contains(t, out, "note: the server knows a pod's namespace")

	out, stderr, code = runCLI(t, "", "identity", "explain", "--admin", "http://"+admin,
		"--namespace", "pay", "--service-account", "api", "--label", "app=checkout", "-o", "json")
	require.Equal(t, 0, code, stderr)
	var ex api.IdentityExplanation
	require.NoError(t, json.Unmarshal([]byte(out), &ex))
	assert.Empty(t, ex.SPIFFEID)
	assert.Contains(t, ex.Error, "rules give this workload different SPIFFE IDs")
	assert.Len(t, ex.Matched, 2)

	_, stderr, code = runCLI(t, "", "identity", "explain", "--admin", "http://"+admin, "--namespace", "pay", "--service-account", "api", "--uid", "0")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "need --identity-map: the server knows no process")
	_, stderr, code = runCLI(t, "", "identity", "explain", "--admin", "http://"+admin, "--namespace", "pay")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "namespace and service_account are required")

	out, stderr, _ = runCLI(t, "", "audit", "--admin", "http://"+admin, "--fail-on", "none")
	assert.Contains(t, out+stderr, "identity_map_conflict")
	assert.Contains(t, out+stderr, "identity_map_rule_agent_only")
}

// Offline, from a file, as a node agent sees a process: host processes by
// their unix facts, a bad file refused with its line.
func TestIdentityExplainOffline(t *testing.T) {
	path := writeIdentityMap(t)
	args := []string{"identity", "explain", "--identity-map", path, "--trust-domain", "example.org"}
	out, stderr, code := runCLI(t, "", append(args, "--host", "--uid", "65534", "--binary-path", "/usr/bin/node_exporter")...)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "host process, uid 65534 gid 0 /usr/bin/node_exporter")
	assert.Contains(t, out, "identity: spiffe://example.org/node/exporter")
	assert.NotContains(t, out, "note:")

	out, stderr, code = runCLI(t, "", append(args, "--namespace", "misc", "--service-account", "tool", "--identity-default", "none")...)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "no rule selects it\nidentity: none\n")

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("rules:\n- name: x\n  spiffeID: spiffe://{{.TrustDomain}}/x\n"), 0o600))
	_, stderr, code = runCLI(t, "", "identity", "explain", "--identity-map", bad, "--trust-domain", "example.org", "--namespace", "a", "--service-account", "b")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "bad.yaml:2: rule 1: missing required key \"workloads\"")
	_, stderr, code = runCLI(t, "", "identity", "explain", "--identity-map", path, "--namespace", "a", "--service-account", "b")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "--trust-domain")
}

// SIGHUP re-reads --identity-map: a bad edit keeps the last good rules
// and shows the error in the snapshot; a good one is in force at once.
func TestIdentityMapReload(t *testing.T) {
	path := writeIdentityMap(t)
	o := policyServer(t, func(o *server.Config) {
		o.IdentityMap = server.IdentityMapConfig{File: path, Poll: time.Hour}
	})
	admin, hup, logs := launchReloadable(t, o)

	require.NoError(t, os.WriteFile(path, []byte("rules:\n- name: x\n  spiffeID: spiffe://{{.TrustDomain}}/x\n"), 0o600))
	servertest.HUPAndWait(t, hup, logs, "identity map file refused; keeping the last good rules", 1)
	snap := servertest.GetSnapshot(t, "http://"+admin)
	require.NotNil(t, snap.IdentityMap)
	assert.Len(t, snap.IdentityMap.Rules, 3, "the last good rules")
	require.Len(t, snap.IdentityMap.Sources, 1)
	assert.Contains(t, snap.IdentityMap.Sources[0].LastError, `missing required key "workloads"`)

	require.NoError(t, os.WriteFile(path, []byte("rules:\n- name: x\n  workloads: [{namespace: x}]\n  spiffeID: spiffe://{{.TrustDomain}}/x\n"), 0o600))
	servertest.HUPAndWait(t, hup, logs, "identity map file loaded", 2)
	snap = servertest.GetSnapshot(t, "http://"+admin)
	assert.Len(t, snap.IdentityMap.Rules, 1)
	assert.Empty(t, snap.IdentityMap.Sources[0].LastError)
}
