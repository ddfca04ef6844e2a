//go:build linux

package agent

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/server/nodeauth"
	"github.com/trustbridge/trustbridge/internal/testkit/cgrouptest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
	"github.com/trustbridge/trustbridge/sds"
	"github.com/trustbridge/trustbridge/sds/attest"
	"github.com/trustbridge/trustbridge/sds/broker"
)

// realWait bounds every wait of these tests on something the agent, the
// server, the API server or a child does, so a broken test fails instead
// of hanging; no outcome depends on it.
const realWait = 30 * time.Second

// agentAccount is the node agent's service account, the server's trusted
// node account.
const agentAccount = "trustbridge-agent"

// realNode is a node agent in node mode (the real attestor with its pod
// informer on node A, the default Istio identity map) on real unix
// sockets, in front of the real certificate service, which authenticates
// the agent's token by TokenReview and authorizes impersonation with the
// server's node authorizer, both against a real kube-apiserver. Node A
// runs the agent's pod, web's and api's; node B runs db's.
type realNode struct {
	env          *kubetest.Env
	ns           string
	nodeA, nodeB string
	agentPod     *corev1.Pod
	// web, api and db are the workloads, by their Istio-form IDs.
	web, api, db workloadPod

	cs     *certService
	na     *nodeauth.Authorizer // the server's node authorizer
	fed    *federation
	policy *trustpolicy.Cell
	b, c   *testca.CA
	pods   *attest.Pods
	reg    *prometheus.Registry
	sds    string // the SDS socket
	wl     string // the Workload API socket
	broker string // the broker socket, with realNodeOptions.broker
	// ztunnel is the broker's pod on node A, with realNodeOptions.broker.
	ztunnel workloadPod
	done    <-chan error

	// idmap is the identity map of the agent and the server alike: the
	// default (Istio's form) unless startRealNodeWith gave rules.
	idmap *identitymap.Map
	// web2 is a second pod of web's service account on node A, made
	// when startRealNodeWith asked for it.
	web2 workloadPod
}

// realNodeOptions change the fixture startRealNodeWith builds.
type realNodeOptions struct {
	rules []identitymap.Rule // the identity map's, of agent and server
	web2  bool               // a second pod of web's service account on node A
	// broker serves the broker socket to ztunnel's service account (a
	// pod of node A), and the server mints JWT-SVIDs.
	broker bool
	// ttl is the lifetime the agent asks for its workloads' certificates.
	ttl time.Duration
}

// workloadPod is a pod with one container, whose ID its status carries.
type workloadPod struct {
	pod *corev1.Pod
	id  spiffeid.ID
	cid string // the container's ID (containerd's form, bare)
}

// startRealNode builds the cluster, the server and the agent; clk, when
// set, is the agent's clock.
func startRealNode(t *testing.T, clk *clocktesting.FakeClock) *realNode {
	t.Helper()
	return startRealNodeWith(t, clk, realNodeOptions{})
}

// startRealNodeWith is startRealNode with opts.
func startRealNodeWith(t *testing.T, clk *clocktesting.FakeClock, opts realNodeOptions) *realNode {
	t.Helper()
	f := &realNode{env: kubetest.Shared(t), nodeA: "node-a-" + randomHex(t, 4), nodeB: "node-b-" + randomHex(t, 4),
		fed: &federation{changed: make(chan struct{})}, b: testca.New(t, tdB.Name()), c: testca.New(t, tdC.Name())}
	f.ns = f.env.Namespace(t)
	for _, sa := range []string{agentAccount, "web", "api", "db", "ztunnel"} {
		_, err := f.env.Client.CoreV1().ServiceAccounts(f.ns).Create(context.Background(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	f.agentPod = f.createPod(t, "trustbridge-agent-a", agentAccount, f.nodeA).pod
	f.web = f.createPod(t, "web-a", "web", f.nodeA)
	f.api = f.createPod(t, "api-a", "api", f.nodeA)
	f.db = f.createPod(t, "db-b", "db", f.nodeB)
	if opts.web2 {
		f.web2 = f.createPod(t, "web-a2", "web", f.nodeA)
	}
	if opts.broker {
		f.ztunnel = f.createPod(t, "ztunnel-a", "ztunnel", f.nodeA)
	}
	var err error
	f.idmap, err = identitymap.Compile(identitymap.Config{TrustDomain: tdA}, opts.rules)
	require.NoError(t, err)
	f.policy = trustpolicy.NewCell(f.trustPolicy(t, map[spiffeid.ID][]string{f.web.id: {tdB.Name()}, f.api.id: {tdC.Name()}}))
	f.startServer(t)
	f.startAgent(t, clk, opts)
	return f
}

// createPod creates a running pod of service account sa on node, its
// container's ID in its status as the kubelet writes it.
func (f *realNode) createPod(t *testing.T, name, sa, node string) workloadPod {
	t.Helper()
	ctx := context.Background()
	noToken := false
	pod, err := f.env.Client.CoreV1().Pods(f.ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa, AutomountServiceAccountToken: &noToken,
			Containers: []corev1.Container{{Name: "app", Image: "example.com/" + name + ":1"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	cid := randomHex(t, 32)
	pod.Status.Phase = corev1.PodRunning
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", ContainerID: "containerd://" + cid,
		Image: pod.Spec.Containers[0].Image, ImageID: "example.com/" + name + "@sha256:" + cid, Ready: true}}
	pod, err = f.env.Client.CoreV1().Pods(f.ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	require.NoError(t, err)
	return workloadPod{pod: pod, id: spiffeid.RequireFromSegments(tdA, "ns", f.ns, "sa", sa), cid: cid}
}

// trustPolicy grants each workload its trust domains, whole.
func (f *realNode) trustPolicy(t *testing.T, grants map[spiffeid.ID][]string) *trustpolicy.Policy {
	t.Helper()
	var rules []trustpolicy.Rule
	for id, tds := range grants {
		r := trustpolicy.Rule{Name: strings.ReplaceAll(id.Path()[1:], "/", "-"), Workloads: []trustpolicy.Selector{{SPIFFEID: id.String()}}}
		for _, td := range tds {
			r.TrustDomains = append(r.TrustDomains, trustpolicy.TrustDomainGrant{TrustDomain: td})
		}
		rules = append(rules, r)
	}
	p, err := trustpolicy.Compile(tdA, trustpolicy.DefaultDeny, rules)
	require.NoError(t, err)
	return p
}

// startServer starts the certificate service as the server wires it for
// node agents: TokenReview authenticates tokens (the pod a token is bound
// to included), the node authorizer reads pods, both from the API server.
func (f *realNode) startServer(t *testing.T) {
	t.Helper()
	client := f.env.Client
	tr, err := authn.NewTokenReview(authn.TokenReviewConfig{Client: client, TrustDomain: tdA,
		IssuerKeys: authn.RESTFetch(client.Discovery().RESTClient()), Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	startServing(t, tr.Run)
	cfg := nodeauth.Config{Client: client, TrustDomain: tdA, TrustedNodeAccounts: []string{f.ns + "/" + agentAccount}}
	if len(f.idmap.Rules()) > 0 {
		cfg.IdentityMap = identitymap.NewCell(f.idmap) // the server's --identity-map: the agent's rules
	}
	na, err := nodeauth.New(cfg)
	require.NoError(t, err)
	startServing(t, na.Run)
	f.na = na
	// The pods exist already: once listed, the authorizer knows them all.
	ctx, cancel := context.WithTimeout(context.Background(), realWait)
	defer cancel()
	require.True(t, cache.WaitForCacheSync(ctx.Done(), na.HasSynced), "the node authorizer's pods")
	f.cs = newCertServiceWith(t, func(cfg *certservice.Config, authority *ca.Authority) {
		f.fed.bundles = []*spiffebundle.Bundle{authority.Bundle(), f.b.Bundle(), f.c.Bundle()}
		cfg.Bundles = f.fed
		cfg.Policy = trustpolicy.NewAccess(f.policy, nil)
		cfg.Authenticator = tr
		cfg.Impersonator = na
		cfg.JWT = authority
	})
}

// startAgent starts the node agent of node A with a token bound to its
// pod, as the kubelet projects it.
func (f *realNode) startAgent(t *testing.T, clk *clocktesting.FakeClock, opts realNodeOptions) {
	t.Helper()
	secs := int64(3600)
	tr, err := f.env.Client.CoreV1().ServiceAccounts(f.ns).CreateToken(context.Background(), agentAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{tdA.Name()}, ExpirationSeconds: &secs,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: f.agentPod.Name, UID: f.agentPod.UID}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	dir := shortDir(t)
	token := filepath.Join(dir, "token")
	writeFile(t, token, []byte(tr.Status.Token))

	f.reg = prometheus.NewRegistry()
	// Every pod is in the informer's cache before any child calls (see
	// waitPods): a refusal need not wait for one to appear.
	f.pods, err = attest.NewPods(attest.PodsConfig{Client: f.env.Client, NodeName: f.nodeA, Wait: 1})
	require.NoError(t, err)
	attestor, err := attest.New(attest.Config{Pods: f.pods, Registerer: f.reg})
	require.NoError(t, err)
	require.Equal(t, identitymap.DefaultIstio, f.idmap.Default())
	f.sds, f.wl = filepath.Join(dir, "node.sock"), filepath.Join(dir, "api.sock")
	cfg := Config{
		SocketPath:        f.sds,
		WorkloadAPISocket: f.wl,
		CredentialsDir:    filepath.Join(dir, "creds"),
		Rotator: &RotatorConfig{CAAddr: f.cs.addr, Roots: f.cs.authority.Bundle().X509Authorities(), ServerID: serverID,
			TokenFile: token, GraceRatio: 0.5},
		Node: &NodeConfig{Attestor: attestor, Map: identitymap.NewCell(f.idmap), NodeName: f.nodeA,
			Runners: []func(context.Context) error{f.pods.Run}},
		RootCA:     sds.RootCASPIFFE, // trustbridge agent --node's default
		Registerer: f.reg,
	}
	if clk != nil {
		cfg.Clock = clk
	}
	cfg.Node.TTL = opts.ttl
	if opts.broker {
		f.broker = filepath.Join(dir, "broker.sock")
		policy, err := broker.ParsePolicy([]string{"sa:" + f.ns + "/ztunnel"})
		require.NoError(t, err)
		cfg.Node.Broker = &BrokerConfig{Socket: f.broker, Policy: policy, Pods: f.pods}
	}
	_, f.done = runAgent(t, newTestAgent(t, cfg))
	waitSocket(t, f.sds, f.done)
	waitSocket(t, f.wl, f.done)
	if opts.broker {
		waitSocket(t, f.broker, f.done)
	}
	f.waitPods(t, f.web, f.api)
}

// waitPods waits until the agent's pod informer knows each pod's
// container.
func (f *realNode) waitPods(t *testing.T, pods ...workloadPod) {
	t.Helper()
	for _, p := range pods {
		waitUnlessEnded(t, f.done, func() bool {
			_, err := f.pods.Lookup(context.Background(), string(p.pod.UID), p.cid)
			return err == nil
		})
	}
}

// identities is the agent's trustbridge_agent_identity_entries.
func (f *realNode) identities(t *testing.T) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "trustbridge_agent_identity_entries" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no trustbridge_agent_identity_entries")
	return 0
}

// roots is what a workload granted tds whole is given, by trust domain.
func (f *realNode) roots(tds ...spiffeid.TrustDomain) map[string][]string {
	out := bundleRoots(f.cs.authority.Bundle().X509Bundle())
	for _, td := range tds {
		for _, b := range f.fed.current() {
			if b.TrustDomain() == td {
				out[td.Name()] = bundleRoots(b.X509Bundle())[td.Name()]
			}
		}
	}
	return out
}

func (f *federation) current() []*spiffebundle.Bundle {
	b, _ := f.Bundles()
	return b
}

// cgroupOf makes p's container cgroup under h.
func cgroupOf(t *testing.T, h cgrouptest.Hierarchy, p workloadPod) string {
	t.Helper()
	return h.Container(t, string(p.pod.UID), p.cid)
}

// kid is a running child (childMain): a workload process of the node.
type kid struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan childLine
	exited chan struct{}
	stderr *lockedBuffer
	// latest is the last answer on each stream collect saw.
	latest map[string]childLine
}

// startChild starts a child, has the kernel move it into the cgroup dir
// (none: it stays in this test's, the host's), and returns it once it is
// there; it has not called the agent yet. It is killed and reaped when the
// test ends, before the cgroup is removed.
func (f *realNode) startChild(t *testing.T, dir string) *kid {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	k := &kid{cmd: exec.Command(self), lines: make(chan childLine, 64), exited: make(chan struct{}), stderr: &lockedBuffer{},
		latest: map[string]childLine{}}
	k.cmd.Env = append(os.Environ(), childEnv+"=1", childSDSEnv+"="+f.sds, childWLEnv+"="+f.wl, childBrokerEnv+"="+f.broker)
	k.cmd.Stderr = k.stderr
	k.stdin, err = k.cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := k.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, k.cmd.Start())
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer close(k.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var l childLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				l = childLine{Stream: "?", Msg: sc.Text()}
			}
			k.lines <- l
		}
	}()
	go func() {
		<-read // Wait closes stdout: read it all first
		_ = k.cmd.Wait()
		close(k.exited)
	}()
	t.Cleanup(func() {
		_ = k.cmd.Process.Kill()
		<-k.exited
	})
	if dir != "" {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(k.cmd.Process.Pid)), 0o644))
	}
	return k
}

// do sends the child a command.
func (k *kid) do(t *testing.T, cmd string) {
	t.Helper()
	_, err := fmt.Fprintln(k.stdin, cmd)
	require.NoError(t, err)
}

// next is the child's next answer.
func (k *kid) next(t *testing.T) childLine {
	t.Helper()
	select {
	case l, ok := <-k.lines:
		if !ok {
			<-k.exited
			t.Fatalf("child exited (%v) without an answer: %s", k.cmd.ProcessState, k.stderr)
		}
		return l
	case <-time.After(realWait):
		t.Fatalf("no answer from the child within %s: %s", realWait, k.stderr)
		return childLine{}
	}
}

// ask runs cmd in the child and returns its answer.
func (k *kid) ask(t *testing.T, cmd string) childLine {
	t.Helper()
	k.do(t, cmd)
	return k.next(t)
}

// stop ends the child (EOF on stdin) and checks it exited cleanly.
func (k *kid) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, k.stdin.Close())
	select {
	case <-k.exited:
	case <-time.After(realWait):
		t.Fatalf("child did not exit within %s: %s", realWait, k.stderr)
	}
	assert.True(t, k.cmd.ProcessState.Success(), "child: %v: %s", k.cmd.ProcessState, k.stderr)
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// Real parts end to end (the main tests): two processes in the
// cgroups of two pods of node A ask the node agent's Workload API through
// go-spiffe's client and get each its own Istio-form identity, which the
// server issued to the node on its pod-bound token (TokenReview, the node
// authorizer), with the bundles the trust policy gives that workload; a
// process in the pod of node B, and one in no pod, get nothing, and are
// told why. In v1's pids hierarchy and in v2's.
func TestNodeRealWorkloadAPI(t *testing.T) {
	f := startRealNode(t, nil)
	for _, h := range cgrouptest.Hierarchies() {
		t.Run(h.Name, func(t *testing.T) {
			h.Require(t)
			web, api := f.startChild(t, cgroupOf(t, h, f.web)), f.startChild(t, cgroupOf(t, h, f.api))
			w, a := web.ask(t, cmdX509), api.ask(t, cmdX509)
			require.Empty(t, w.Code, "web: %s", w.Msg)
			require.Empty(t, a.Code, "api: %s", a.Msg)
			assert.Equal(t, f.web.id.String(), w.ID)
			assert.Equal(t, f.api.id.String(), a.ID)
			assert.True(t, w.Verified && a.Verified, "each SVID verifies against the bundles it came with")
			assert.Equal(t, f.roots(tdB), w.Roots, "web trusts b.test")
			assert.Equal(t, f.roots(tdC), a.Roots, "api trusts c.test")
			web.stop(t)
			api.stop(t)

			db := f.startChild(t, cgroupOf(t, h, f.db))
			d := db.ask(t, cmdX509)
			assert.Equal(t, "PermissionDenied", d.Code, "a pod of node B, asking node A's agent: %+v", d)
			assert.Contains(t, d.Msg, "no pod with the caller's pod UID on this node")
			assert.Contains(t, d.Msg, string(f.db.pod.UID))
			t.Logf("node B's pod is told: %s", d.Msg)
			db.stop(t)
		})
	}

	t.Run("host", func(t *testing.T) {
		host := f.startChild(t, "")
		l := host.ask(t, cmdX509)
		assert.Equal(t, "PermissionDenied", l.Code, "a process in no pod: %+v", l)
		assert.Contains(t, l.Msg, `gives identities to Kubernetes workloads only`)
		t.Logf("a process in no pod is told: %s", l.Msg)
		host.stop(t)
	})
}

// collect reads the child's answers until done accepts the latest one of
// each stream (since the child started), and returns those.
func (k *kid) collect(t *testing.T, done func(map[string]childLine) bool) map[string]childLine {
	t.Helper()
	for !done(k.latest) {
		l := k.next(t)
		k.latest[l.Stream] = l
	}
	return maps.Clone(k.latest)
}

// sdsAnswers accepts the latest default and ROOTCA once both are in and
// ROOTCA holds roots; a refusal on either fails the test.
func sdsAnswers(t *testing.T, roots map[string][]string) func(map[string]childLine) bool {
	return func(m map[string]childLine) bool {
		for _, l := range m {
			require.Empty(t, l.Code, "%s refused: %s", l.Stream, l.Msg)
		}
		d, r := m[sds.DefaultName], m[sds.RootCAName]
		return d.ID != "" && r.Roots != nil && (roots == nil || assert.ObjectsAreEqual(roots, r.Roots))
	}
}

// streamAnswers accepts the latest answers once default, ROOTCA and the
// Workload API stream are in, and ROOTCA and the Workload API's bundles
// hold roots (roots, when set); a refusal on any fails the test.
func streamAnswers(t *testing.T, roots map[string][]string) func(map[string]childLine) bool {
	return func(m map[string]childLine) bool {
		for _, l := range m {
			require.Empty(t, l.Code, "%s refused: %s", l.Stream, l.Msg)
		}
		d, r, w := m[sds.DefaultName], m[sds.RootCAName], m[cmdWatch]
		return d.ID != "" && r.Roots != nil && w.Roots != nil &&
			(roots == nil || assert.ObjectsAreEqual(roots, r.Roots) && assert.ObjectsAreEqual(roots, w.Roots))
	}
}

// The streams of two pods' processes, open while the trust changes: SDS
// as Istio's Envoy asks it, default on one stream and ROOTCA on another
// (node mode serves ROOTCA as Envoy's SPIFFE validator), and the Workload
// API's X509-SVID stream. Each pod gets its own certificate and the trust
// the policy gives it; a federated peer's root rotation, then a policy
// change, are pushed on the open streams, each to the pods they concern.
func TestNodeRealStreams(t *testing.T) {
	h := cgrouptest.V2()
	h.Require(t)
	f := startRealNode(t, nil)
	web, api := f.startChild(t, cgroupOf(t, h, f.web)), f.startChild(t, cgroupOf(t, h, f.api))
	for _, k := range []*kid{web, api} {
		k.do(t, cmdSDS)
		k.do(t, cmdWatch)
	}
	w := web.collect(t, streamAnswers(t, nil))
	a := api.collect(t, streamAnswers(t, nil))
	for _, name := range []string{sds.DefaultName, cmdWatch} {
		assert.Equal(t, f.web.id.String(), w[name].ID, name)
		assert.Equal(t, f.api.id.String(), a[name].ID, name)
	}
	for _, name := range []string{sds.RootCAName, cmdWatch} {
		assert.Equal(t, f.roots(tdB), w[name].Roots, "web's %s: a.test and b.test", name)
		assert.Equal(t, f.roots(tdC), a[name].Roots, "api's %s: a.test and c.test", name)
	}

	// b.test rotates its root: web, which trusts it, gets the new one.
	f.fed.replace(testca.New(t, tdB.Name()).Bundle())
	w = web.collect(t, streamAnswers(t, f.roots(tdB)))
	assert.Equal(t, f.web.id.String(), w[sds.DefaultName].ID)

	// web is granted c.test too, api b.test instead of c.test.
	f.policy.Set(f.trustPolicy(t, map[spiffeid.ID][]string{f.web.id: {tdB.Name(), tdC.Name()}, f.api.id: {tdB.Name()}}))
	web.collect(t, streamAnswers(t, f.roots(tdB, tdC)))
	api.collect(t, streamAnswers(t, f.roots(tdB)))
	web.stop(t)
	api.stop(t)
}

// The server alone decides which identities run on the node: a pod the
// agent still finds on node A, but which is terminating (its deletion
// waits for a kubelet, which these tests have none of), is attested by
// the agent and refused by the server's node authorizer; its process is
// refused with the server's reason, and nothing is cached.
func TestNodeRealServerRefuses(t *testing.T) {
	h := cgrouptest.V2()
	h.Require(t)
	f := startRealNode(t, nil)
	ctx := context.Background()
	grace := int64(300)
	require.NoError(t, f.env.Client.CoreV1().Pods(f.ns).Delete(ctx, f.api.pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace}))
	node := authn.Identity{ID: spiffeid.RequireFromSegments(tdA, "ns", f.ns, "sa", agentAccount), Method: authn.MethodKubernetesJWT,
		Pod: authn.PodRef{Namespace: f.ns, Name: f.agentPod.Name, UID: string(f.agentPod.UID)}}
	waitUnlessEnded(t, f.done, func() bool {
		return errors.Is(f.na.AuthorizeImpersonation(ctx, node, f.api.id), nodeauth.ErrNotAuthorized)
	})
	_, err := f.pods.Lookup(ctx, string(f.api.pod.UID), f.api.cid)
	require.NoError(t, err, "the agent still finds the terminating pod")

	api := f.startChild(t, cgroupOf(t, h, f.api))
	l := api.ask(t, cmdX509)
	assert.Equal(t, "PermissionDenied", l.Code, "%+v", l)
	assert.Contains(t, l.Msg, "no running pod of service account "+f.ns+"/api is on node "+f.nodeA)
	t.Logf("the terminating pod is told: %s", l.Msg)
	assert.Equal(t, 0.0, f.identities(t), "a refusal is not cached")
	api.stop(t)
}

// A pod deleted takes its identity with it: a new call from its cgroup is
// refused at once; the streams its process still holds (SDS, the
// Workload API) are refused at their next re-attestation and end; and
// the identity cache drops the identity, which nobody holds any more,
// after its linger. The agent runs on a fake clock, stepped second by
// second until each of these happens.
func TestNodeRealPodDeleted(t *testing.T) {
	h := cgrouptest.V2()
	h.Require(t)
	clk := clocktesting.NewFakeClock(time.Now())
	f := startRealNode(t, clk)
	cg := cgroupOf(t, h, f.web)
	holder := f.startChild(t, cg)
	holder.do(t, cmdSDS)
	holder.do(t, cmdWatch)
	got := holder.collect(t, func(m map[string]childLine) bool {
		return sdsAnswers(t, f.roots(tdB))(m) && m[cmdWatch].ID != ""
	})
	require.Equal(t, f.web.id.String(), got[sds.DefaultName].ID)
	require.Equal(t, f.web.id.String(), got[cmdWatch].ID)
	assert.Equal(t, 1.0, f.identities(t))

	ctx := context.Background()
	require.NoError(t, f.env.Client.CoreV1().Pods(f.ns).Delete(ctx, f.web.pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
	waitUnlessEnded(t, f.done, func() bool {
		_, err := f.pods.Lookup(ctx, string(f.web.pod.UID), f.web.cid)
		return errors.Is(err, attest.ErrUnknownPod)
	})
	again := f.startChild(t, cg)
	l := again.ask(t, cmdX509)
	assert.Equal(t, "PermissionDenied", l.Code, "a new call from the deleted pod's cgroup: %+v", l)
	assert.Contains(t, l.Msg, "no pod with the caller's pod UID on this node")
	again.stop(t)
	assert.Equal(t, 1.0, f.identities(t), "the open streams still hold it")

	// The streams' next re-attestation refuses the process: the SDS
	// server ends them as Unauthenticated, for Envoy to reconnect with
	// fresh credentials; the reconnection is refused, with why.
	ended := map[string]childLine{}
	stepUntil(t, clk, f.done, "the held streams end", func() bool {
		for {
			select {
			case l, ok := <-holder.lines:
				require.True(t, ok, "the holder exited: %s", holder.stderr)
				if l.Code != "" {
					ended[l.Stream] = l
				}
			default:
				return len(ended) == 3
			}
		}
	})
	t.Logf("ended: %+v", ended)
	for _, name := range []string{sds.DefaultName, sds.RootCAName} {
		assert.Equal(t, "Unauthenticated", ended[name].Code, "%s: %+v", name, ended[name])
		assert.Contains(t, ended[name].Msg, "reconnect with fresh credentials", name)
	}
	assert.Equal(t, "PermissionDenied", ended[cmdWatch].Code, "the Workload API stream: %+v", ended[cmdWatch])
	assert.Contains(t, ended[cmdWatch].Msg, "no pod with the caller's pod UID on this node")
	holder.do(t, cmdSDS)
	refused := map[string]childLine{}
	for len(refused) < 2 {
		l := holder.next(t)
		refused[l.Stream] = l
	}
	for _, name := range []string{sds.DefaultName, sds.RootCAName} {
		assert.Equal(t, "PermissionDenied", refused[name].Code, "%s reconnected: %+v", name, refused[name])
		assert.Contains(t, refused[name].Msg, "no pod with the caller's pod UID on this node", name)
	}
	stepUntil(t, clk, f.done, "the identity dropped", func() bool { return f.identities(t) == 0 })
	holder.stop(t)
}

// stepUntil steps clk a second at a time, every 10ms, until cond holds,
// failing the test if the agent's Run ends first or after realWait. cond
// runs on the test's goroutine.
func stepUntil(t *testing.T, clk *clocktesting.FakeClock, done <-chan error, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(realWait)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		clk.Step(time.Second)
		select {
		case err := <-done:
			t.Fatalf("Run ended: %v", err)
		case <-deadline:
			t.Fatalf("%s: not within %s", what, realWait)
		case <-tick.C:
		}
	}
}

// handedOff starts a child in this test's cgroup that connects to the SDS
// socket and hands the connection over before it exits; it returns the
// connection and the pid that made it, now free (the child is reaped).
func (f *realNode) handedOff(t *testing.T) (net.Conn, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	ours, theirs := os.NewFile(uintptr(fds[0]), "handoff"), os.NewFile(uintptr(fds[1]), "handoff")
	defer ours.Close()
	self, err := os.Executable()
	require.NoError(t, err)
	var stderr lockedBuffer
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), childEnv+"="+childHandoff, childSDSEnv+"="+f.sds)
	cmd.ExtraFiles, cmd.Stderr = []*os.File{theirs}, &stderr
	err = cmd.Run()
	theirs.Close()
	require.NoError(t, err, "child: %s", &stderr)

	c, err := net.FileConn(ours)
	require.NoError(t, err)
	defer c.Close()
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := c.(*net.UnixConn).ReadMsgUnix(make([]byte, 1), oob)
	require.NoError(t, err)
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	got, err := unix.ParseUnixRights(&msgs[0])
	require.NoError(t, err)
	require.Len(t, got, 1)
	file := os.NewFile(uintptr(got[0]), "sds")
	defer file.Close()
	conn, err := net.FileConn(file)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn, cmd.Process.Pid
}

// startChildAt starts a child (startChild, in this test's cgroup) whose
// pid is pid, free now: the kernel hands out ns_last_pid+1 next, unless
// another process or thread of the machine takes it first, so it tries
// again a bounded number of times.
func (f *realNode) startChildAt(t *testing.T, pid int) *kid {
	t.Helper()
	for range 100 {
		require.NoError(t, os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0o644))
		k := f.startChild(t, "")
		if k.cmd.Process.Pid == pid {
			return k
		}
		k.stop(t)
	}
	t.Skipf("could not start a process at pid %d: the machine forks too busily", pid)
	return nil
}

// Pid reuse at the agent: a process in no pod connects to the SDS socket,
// hands the connection to another process and exits; its pid is given to
// a process the kernel then moves into web's pod, which gets web's
// identity when it asks for itself. The connection the first process
// made is refused (the caller is pinned at the handshake by pidfd and
// start time), never served web's identity by following the pid.
func TestNodeRealPidReuse(t *testing.T) {
	h := cgrouptest.V2()
	h.Require(t)
	if err := unix.Access("/proc/sys/kernel/ns_last_pid", unix.W_OK); err != nil {
		t.Skipf("cannot choose the next pid (/proc/sys/kernel/ns_last_pid): %v", err)
	}
	f := startRealNode(t, nil)
	cg := cgroupOf(t, h, f.web)
	conn, pid := f.handedOff(t)

	reuser := f.startChildAt(t, pid)
	require.NoError(t, os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644))
	l := reuser.ask(t, cmdX509)
	require.Empty(t, l.Code, "the process now at pid %d, in web's pod: %s", pid, l.Msg)
	assert.Equal(t, f.web.id.String(), l.ID, "pid %d is web's now", pid)

	dialed := false
	cc, err := grpc.NewClient("passthrough:///sds", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) {
			if dialed {
				return nil, errors.New("the handed-off connection is used once")
			}
			dialed = true
			return conn, nil
		}))
	require.NoError(t, err)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), realWait)
	defer cancel()
	_, err = secretv3.NewSecretDiscoveryServiceClient(cc).FetchSecrets(ctx, fetchRequest(sds.DefaultName))
	require.Error(t, err, "the connection pid %d made before it was reused got a secret", pid)
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "exited or was replaced")
	t.Logf("the handed-off connection is told: %s", status.Convert(err).Message())
	reuser.stop(t)
}

// A rule's DNS names reach the workload's certificate, end to end: the
// agent asks for the names the map gives each pod, the server (the same
// rules as its --identity-map) grants exactly those its map gives a pod of
// the node. Two pods of one service account get one SPIFFE ID and each its
// own name, never the other's.
func TestNodeRealDNSNames(t *testing.T) {
	h := cgrouptest.V2()
	h.Require(t)
	rules := []identitymap.Rule{{
		Name:      "web-by-pod",
		Workloads: []identitymap.Selector{{ServiceAccount: "web", Kubernetes: true}},
		SPIFFEID:  "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/sa/{{.ServiceAccount}}",
		DNSNames:  []string{"{{.PodName}}.{{.Namespace}}.svc"},
	}}
	f := startRealNodeWith(t, nil, realNodeOptions{rules: rules, web2: true})
	f.waitPods(t, f.web2)

	one, two := f.startChild(t, cgroupOf(t, h, f.web)), f.startChild(t, cgroupOf(t, h, f.web2))
	a, b := one.ask(t, cmdX509), two.ask(t, cmdX509)
	require.Empty(t, a.Code, "web-a: %s", a.Msg)
	require.Empty(t, b.Code, "web-a2: %s", b.Msg)
	assert.Equal(t, f.web.id.String(), a.ID)
	assert.Equal(t, a.ID, b.ID, "one service account, one SPIFFE ID")
	assert.Equal(t, []string{"web-a." + f.ns + ".svc"}, a.DNSNames)
	assert.Equal(t, []string{"web-a2." + f.ns + ".svc"}, b.DNSNames, "its own name, not the other pod's")
	assert.True(t, a.Verified && b.Verified)
	assert.Equal(t, 2.0, f.identities(t), "two certificates of one ID")

	// api's pod, which no rule selects, gets the default (Istio's form)
	// and no name.
	api := f.startChild(t, cgroupOf(t, h, f.api))
	c := api.ask(t, cmdX509)
	require.Empty(t, c.Code, "api: %s", c.Msg)
	assert.Equal(t, f.api.id.String(), c.ID)
	assert.Empty(t, c.DNSNames)
}
