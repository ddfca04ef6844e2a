//go:build linux

package agent

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/testkit/cgrouptest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// answered accepts the latest answers once every label has one.
func answered(labels ...string) func(map[string]childLine) bool {
	return func(m map[string]childLine) bool {
		for _, l := range labels {
			if _, ok := m[l]; !ok {
				return false
			}
		}
		return true
	}
}

// pid is the child's pid, as a broker names it.
func (k *kid) pid() int32 { return int32(k.cmd.Process.Pid) }

// Brokers end to end, on the real node tier (real kube-apiserver, real
// cgroups, the real certificate service): ztunnel's pod on node A, an
// authorised broker, gets through go-spiffe's Broker API client the
// SVIDs of web and api (two pods of node A) by pid and by pod reference,
// and through spire-api-sdk's Delegated Identity API client by pid, each
// with the trust the policy grants that workload, and over mutual TLS with
// its own SVID from the Workload API (web, over mutual TLS too, is refused
// as its certificate's ID); a rotation, a federated
// bundle change and a policy change reach its open streams; a JWT-SVID it
// fetches for web validates in a federated trust domain. It is refused
// for node B's pod, for a pid in no pod; web, not a broker, is refused;
// a workload process that exits ends its streams.
func TestNodeRealBroker(t *testing.T) {
	h := cgrouptest.V2()
	h.Require(t)
	clk := clocktesting.NewFakeClock(time.Now())
	f := startRealNodeWith(t, clk, realNodeOptions{broker: true, ttl: 2 * time.Minute})
	f.waitPods(t, f.ztunnel)
	web, api := f.startChild(t, cgroupOf(t, h, f.web)), f.startChild(t, cgroupOf(t, h, f.api))
	host := f.startChild(t, "")
	zt := f.startChild(t, cgroupOf(t, h, f.ztunnel))

	zt.do(t, brokerCall{Label: "web-pid", PID: web.pid()}.command())
	zt.do(t, brokerCall{Label: "api-pod", Namespace: f.ns, Pod: f.api.pod.Name}.command())
	zt.do(t, brokerCall{Label: "web-uid", UID: string(f.web.pod.UID)}.command())
	zt.do(t, brokerCall{Label: "api-spire", Delegated: true, PID: api.pid()}.command())
	// ztunnel's selector mode (k8s:ns with k8s:sa), and the Broker API's
	// ServiceAccount reference: the account's running pods on this node.
	zt.do(t, brokerCall{Label: "web-spire-sa", Delegated: true, Selectors: []string{"k8s:ns:" + f.ns, "k8s:sa:web"}}.command())
	zt.do(t, brokerCall{Label: "api-sa", Namespace: f.ns, ServiceAccount: "api"}.command())
	agentID := spiffeid.RequireFromSegments(tdA, "ns", f.ns, "sa", agentAccount)
	zt.do(t, brokerCall{Label: "web-mtls", MTLS: true, Server: agentID.String(), PID: web.pid()}.command())
	got := zt.collect(t, answered("web-pid", "api-pod", "web-uid", "api-spire", "web-spire-sa", "api-sa", "web-mtls"))
	for label, l := range got {
		require.Empty(t, l.Code, "%s: %s", label, l.Msg)
	}
	assert.Equal(t, f.web.id.String(), got["web-pid"].ID)
	assert.Equal(t, f.roots(tdB), got["web-pid"].Roots, "web trusts b.test")
	assert.Equal(t, f.web.id.String(), got["web-uid"].ID)
	assert.Equal(t, f.web.id.String(), got["web-mtls"].ID, "over mutual TLS, ztunnel's SVID from the Workload API")
	assert.Equal(t, f.api.id.String(), got["api-pod"].ID)
	assert.Equal(t, f.roots(tdC), got["api-pod"].Roots, "api trusts c.test")
	assert.Equal(t, f.api.id.String(), got["api-spire"].ID)
	assert.Equal(t, []string{tdC.IDString()}, got["api-spire"].FederatesWith)
	assert.Equal(t, f.web.id.String(), got["web-spire-sa"].ID)
	assert.Equal(t, []string{tdB.IDString()}, got["web-spire-sa"].FederatesWith)
	assert.Equal(t, f.api.id.String(), got["api-sa"].ID)

	// Refusals, each with its reason.
	zt.do(t, brokerCall{Label: "db-pod", Namespace: f.ns, Pod: f.db.pod.Name}.command())
	zt.do(t, brokerCall{Label: "host-pid", PID: host.pid()}.command())
	zt.do(t, brokerCall{Label: "db-sa", Delegated: true, Selectors: []string{"k8s:ns:" + f.ns, "k8s:sa:db"}}.command())
	zt.do(t, brokerCall{Label: "agent-pod", Namespace: f.ns, Pod: f.agentPod.Name}.command())
	web.do(t, brokerCall{Label: "web-as-broker", PID: api.pid()}.command())
	web.do(t, brokerCall{Label: "web-as-broker-mtls", MTLS: true, Server: agentID.String(), PID: api.pid()}.command())
	refused := zt.collect(t, answered("db-pod", "host-pid", "db-sa", "agent-pod"))
	assert.Equal(t, "PermissionDenied", refused["agent-pod"].Code, "the agent's own pod: %+v", refused["agent-pod"])
	assert.Contains(t, refused["agent-pod"].Msg, "the node agent's own identity, which is never brokered")
	assert.Equal(t, "NotFound", refused["db-sa"].Code, "db's service account runs on node B only: %+v", refused["db-sa"])
	assert.Contains(t, refused["db-sa"].Msg, "no running pod of service account "+f.ns+"/db is on node "+f.nodeA)
	assert.Equal(t, "NotFound", refused["db-pod"].Code, "node B's pod: %+v", refused["db-pod"])
	assert.Contains(t, refused["db-pod"].Msg, f.nodeA)
	assert.Equal(t, "PermissionDenied", refused["host-pid"].Code, "a pid in no pod: %+v", refused["host-pid"])
	assert.Contains(t, refused["host-pid"].Msg, "is not in a pod")
	notBrokers := web.collect(t, answered("web-as-broker", "web-as-broker-mtls"))
	notBroker := notBrokers["web-as-broker"]
	assert.Equal(t, "PermissionDenied", notBroker.Code, "%+v", notBroker)
	assert.Contains(t, notBroker.Msg, "matches none of the broker rules (sa:"+f.ns+"/ztunnel)")
	certified := notBrokers["web-as-broker-mtls"]
	assert.Equal(t, "PermissionDenied", certified.Code, "%+v", certified)
	assert.Contains(t, certified.Msg, f.web.id.String()+" (certificate)) matches none of the broker rules")
	t.Logf("refused: node B's pod: %s; a host pid: %s; web as a broker: %s", refused["db-pod"].Msg, refused["host-pid"].Msg, notBroker.Msg)

	// b.test rotates its root: web's stream gets it.
	f.fed.replace(testca.New(t, tdB.Name()).Bundle())
	zt.collect(t, func(m map[string]childLine) bool { return assert.ObjectsAreEqual(f.roots(tdB), m["web-pid"].Roots) })
	// api is granted b.test instead of c.test: its streams follow.
	f.policy.Set(f.trustPolicy(t, map[spiffeid.ID][]string{f.web.id: {tdB.Name()}, f.api.id: {tdB.Name()}}))
	zt.collect(t, func(m map[string]childLine) bool {
		return assert.ObjectsAreEqual(f.roots(tdB), m["api-pod"].Roots) && assert.ObjectsAreEqual([]string{tdB.IDString()}, m["api-spire"].FederatesWith)
	})
	// web's certificate is renewed at half its lifetime: a new serial.
	first := zt.latest["web-pid"].Serial
	stepUntil(t, clk, f.done, "web's certificate renewed", func() bool {
		zt.drain(t)
		return zt.latest["web-pid"].Serial != first
	})
	assert.Equal(t, f.web.id.String(), zt.latest["web-pid"].ID)

	// A JWT-SVID for web, by pod reference, validates where a.test's
	// bundle is trusted (b.test's side of the federation).
	zt.do(t, brokerCall{Label: "web-jwt", JWT: true, Audience: "b.test/gateway", Namespace: f.ns, Pod: f.web.pod.Name}.command())
	tok := zt.collect(t, answered("web-jwt"))["web-jwt"]
	require.Empty(t, tok.Code, tok.Msg)
	svid, err := jwtsvid.ParseAndValidate(tok.Token, jwtbundle.NewSet(f.cs.authority.Bundle().JWTBundle()), []string{"b.test/gateway"})
	require.NoError(t, err)
	assert.Equal(t, f.web.id, svid.ID)

	// api's process exits: the streams naming it by pid end; the one
	// naming its pod goes on.
	api.stop(t)
	ended := zt.collect(t, func(m map[string]childLine) bool { return m["api-spire"].Code != "" })
	assert.Equal(t, "NotFound", ended["api-spire"].Code, "%+v", ended["api-spire"])
	assert.Contains(t, ended["api-spire"].Msg, strconv.Itoa(int(api.pid())))
	assert.Empty(t, ended["api-pod"].Code)

	// api's pod is deleted and re-created under its name: the stream on
	// the old pod ends (it named that pod, not whichever has its name).
	ctx := context.Background()
	require.NoError(t, f.env.Client.CoreV1().Pods(f.ns).Delete(ctx, f.api.pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
	again := f.createPod(t, f.api.pod.Name, "api", f.nodeA)
	require.NotEqual(t, f.api.pod.UID, again.pod.UID)
	ended = zt.collect(t, func(m map[string]childLine) bool { return m["api-pod"].Code != "" })
	assert.Equal(t, "NotFound", ended["api-pod"].Code, "%+v", ended["api-pod"])
	zt.stop(t)
	web.stop(t)
	host.stop(t)
}

// drain reads every answer the child has sent so far into k.latest.
func (k *kid) drain(t *testing.T) {
	t.Helper()
	for {
		select {
		case l, ok := <-k.lines:
			require.True(t, ok, "the child exited: %s", k.stderr)
			k.latest[l.Stream] = l
		default:
			return
		}
	}
}
