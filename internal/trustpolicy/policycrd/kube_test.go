package policycrd

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/yaml"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// The tests against a real API server (internal/testkit/kubetest) skip without
// one, unless TRUSTBRIDGE_KUBE_TESTS=require.
func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

var crdPath = filepath.Join("..", "..", "..", "deploy", "base", "trustpolicy-crd.yaml")

// kubeEnv is the shared API server with deploy/base's CRD installed.
func kubeEnv(t *testing.T) (*kubetest.Env, dynamic.Interface) {
	t.Helper()
	e := kubetest.Shared(t)
	return e, e.InstallCRD(t, crdPath)
}

// kube runs a Controller against the real API server.
type kube struct {
	t     *testing.T
	env   *kubetest.Env
	dyn   dynamic.Interface
	clock *clocktesting.FakeClock

	mu      sync.Mutex
	rules   []trustpolicy.Rule
	matched map[string][]string
}

func newKube(t *testing.T) *kube {
	t.Helper()
	e, dyn := kubeEnv(t)
	k := &kube{t: t, env: e, dyn: dyn, clock: clocktesting.NewFakeClock(time.Now()), matched: map[string][]string{}}
	c, err := New(Config{
		Dynamic: dyn, Events: e.Client, LocalTrustDomain: local, Clock: k.clock,
		Apply: ApplyFunc(func(rules []trustpolicy.Rule) error {
			k.mu.Lock()
			defer k.mu.Unlock()
			k.rules = rules
			return nil
		}),
		Matched: func(rule string) (int, []string) {
			rule = strings.TrimPrefix(rule, RuleNamePrefix)
			k.mu.Lock()
			defer k.mu.Unlock()
			return len(k.matched[rule]), k.matched[rule]
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return k
}

// applied is "name=td,td" for every rule applied, sorted.
func (k *kube) applied() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return ruleList(k.rules).names()
}

func (k *kube) waitApplied(want ...string) {
	k.t.Helper()
	slices.Sort(want)
	require.EventuallyWithT(k.t, func(c *assert.CollectT) {
		assert.Equal(c, want, k.applied())
	}, 30*time.Second, 20*time.Millisecond)
}

// create creates a resource from YAML, deleted when the test ends.
func (k *kube) create(doc string) error {
	k.t.Helper()
	return kubetest.CreateYAML(k.t, k.dyn.Resource(GVR), doc)
}

func (k *kube) editSpec(name string, edit func(spec map[string]any)) {
	k.t.Helper()
	require.EventuallyWithT(k.t, func(c *assert.CollectT) {
		u, err := k.dyn.Resource(GVR).Get(context.Background(), name, metav1.GetOptions{})
		require.NoError(c, err)
		edit(u.Object["spec"].(map[string]any))
		_, err = k.dyn.Resource(GVR).Update(context.Background(), u, metav1.UpdateOptions{})
		assert.NoError(c, err, "update (a conflict with a status write is retried)")
	}, 10*time.Second, 20*time.Millisecond)
}

// waitReady waits for name's status to be about its current generation,
// with Ready's reason, and returns the resource.
func (k *kube) waitReady(name, reason string) ClusterTrustPolicy {
	k.t.Helper()
	return kubetest.WaitReady[ClusterTrustPolicy](k.t, k.dyn.Resource(GVR), name, reason)
}

func readyMessage(cr ClusterTrustPolicy) string {
	return meta.FindStatusCondition(cr.Status.Conditions, ConditionReady).Message
}

// events are the events about name (this incarnation: the API server
// outlives one -count iteration).
func (k *kube) events(name string) []string {
	obj, err := k.dyn.Resource(GVR).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(k.t, err)
	list, err := k.env.Client.EventsV1().Events("default").List(context.Background(), metav1.ListOptions{})
	require.NoError(k.t, err)
	var out []string
	for _, e := range list.Items {
		if e.Regarding.UID == obj.GetUID() {
			out = append(out, e.Reason+": "+e.Note)
		}
	}
	return out
}

const goodPolicy = `
apiVersion: trustbridge.dev/v1alpha1
kind: ClusterTrustPolicy
metadata:
  name: kube-payments-to-partner
spec:
  workloads:
  - spiffeID: spiffe://example.org/ns/payments/*
  - namespace: payments
    labels: {matchLabels: {tier: api}}
  trustDomains:
  - name: partner.example
    peers: [spiffe://partner.example/ns/billing/sa/api, spiffe://partner.example/ns/ops/*]
`

// Valid for the schema, refused by the controller: "." and ".." segments
// are not canonical SPIFFE IDs.
const badPolicy = `
apiVersion: trustbridge.dev/v1alpha1
kind: ClusterTrustPolicy
metadata:
  name: kube-dot-segments
spec:
  workloads:
  - spiffeID: spiffe://example.org/ns/../admin/*
  trustDomains:
  - name: partner.example
`

func TestKubeControllerLifecycle(t *testing.T) {
	k := newKube(t)
	const good, bad = "kube-payments-to-partner", "kube-dot-segments"
	require.NoError(t, k.create(goodPolicy))
	require.NoError(t, k.create(badPolicy))

	k.waitApplied(good + "=partner.example")
	cr := k.waitReady(good, ReasonApplied)
	assert.Equal(t, []string{"partner.example"}, cr.Status.TrustDomains)
	assert.Equal(t, &MatchedWorkloads{}, cr.Status.MatchedWorkloads)
	k.mu.Lock()
	assert.Contains(t, k.rules, RuleOf(good, cr.Spec), "the rule is the spec as the API server stored it")
	k.mu.Unlock()

	cr = k.waitReady(bad, ReasonInvalid)
	assert.Contains(t, readyMessage(cr), "spec.workloads[0].spiffeID: pattern \"spiffe://example.org/ns/../admin/*\"")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		evs := k.events(bad)
		require.Len(c, evs, 1)
		assert.Contains(c, evs[0], "Invalid: spec.workloads[0].spiffeID")
	}, 30*time.Second, 50*time.Millisecond)

	// Matched workloads follow on the next tick.
	k.mu.Lock()
	k.matched[good] = []string{"spiffe://example.org/ns/payments/sa/api"}
	k.mu.Unlock()
	require.Eventually(t, k.clock.HasWaiters, 10*time.Second, 10*time.Millisecond)
	k.clock.Step(DefaultStatusInterval)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		cr = k.waitReady(good, ReasonApplied)
		assert.Equal(c, &MatchedWorkloads{Count: 1, Recent: []string{"spiffe://example.org/ns/payments/sa/api"}}, cr.Status.MatchedWorkloads)
	}, 30*time.Second, 50*time.Millisecond)

	// Edited: the new rule applies.
	k.editSpec(good, func(s map[string]any) {
		s["trustDomains"] = append(s["trustDomains"].([]any), map[string]any{"name": "other.example"})
	})
	k.waitApplied(good + "=partner.example,other.example")
	cr = k.waitReady(good, ReasonApplied)
	assert.Equal(t, []string{"partner.example", "other.example"}, cr.Status.TrustDomains)

	// Edited to something the controller refuses: the last good stays.
	k.editSpec(good, func(s map[string]any) {
		s["trustDomains"] = []any{map[string]any{"name": "example.org"}}
	})
	cr = k.waitReady(good, ReasonInvalid)
	assert.Contains(t, readyMessage(cr), `spec.trustDomains[0].name: trust domain "example.org" is the local one`)
	assert.Contains(t, readyMessage(cr), "generation 2 stays applied")
	assert.Equal(t, []string{"partner.example", "other.example"}, cr.Status.TrustDomains)
	assert.Equal(t, []string{good + "=partner.example,other.example"}, k.applied())

	// The bad one fixed, the good one deleted.
	k.editSpec(bad, func(s map[string]any) {
		s["workloads"] = []any{map[string]any{"spiffeID": "spiffe://example.org/ns/admin/*"}}
	})
	require.NoError(t, k.dyn.Resource(GVR).Delete(context.Background(), good, metav1.DeleteOptions{}))
	k.waitApplied(bad + "=partner.example")
	k.waitReady(bad, ReasonApplied)
}

// The API server itself refuses, at admission, what the schema can
// refuse, naming the field.
func TestKubeSchema(t *testing.T) {
	k := &kube{t: t}
	k.env, k.dyn = kubeEnv(t)
	valid := func() map[string]any {
		var m map[string]any
		require.NoError(t, yamlToObject(goodPolicy, &m))
		m["metadata"] = map[string]any{"name": "kube-schema"}
		return m
	}
	spec := func(m map[string]any) map[string]any { return m["spec"].(map[string]any) }
	tests := []struct {
		name string
		edit func(m map[string]any)
		want string
	}{
		{"regex SPIFFE ID", func(m map[string]any) {
			spec(m)["workloads"] = []any{map[string]any{"spiffeID": "spiffe://example.org/ns/.*"}}
		}, "spec.workloads[0].spiffeID"},
		{"wildcard in the middle", func(m map[string]any) {
			spec(m)["workloads"] = []any{map[string]any{"spiffeID": "spiffe://example.org/ns/*/sa/api"}}
		}, "spec.workloads[0].spiffeID"},
		{"empty selector", func(m map[string]any) { spec(m)["workloads"] = []any{map[string]any{}} }, "spec.workloads[0]"},
		{"no workloads", func(m map[string]any) { spec(m)["workloads"] = []any{} }, "spec.workloads"},
		{"no trust domains", func(m map[string]any) { delete(spec(m), "trustDomains") }, "spec.trustDomains"},
		{"trust domain with scheme", func(m map[string]any) {
			spec(m)["trustDomains"] = []any{map[string]any{"name": "spiffe://partner.example"}}
		}, "spec.trustDomains[0].name"},
		{"trust domain twice", func(m map[string]any) {
			spec(m)["trustDomains"] = []any{map[string]any{"name": "a.example"}, map[string]any{"name": "a.example"}}
		}, "Duplicate value"},
		{"peer twice", func(m map[string]any) {
			spec(m)["trustDomains"] = []any{map[string]any{"name": "a.example", "peers": []any{"spiffe://a.example/x", "spiffe://a.example/x"}}}
		}, "Duplicate value"},
		{"bad namespace", func(m map[string]any) { spec(m)["workloads"] = []any{map[string]any{"namespace": "Payments"}} }, "spec.workloads[0].namespace"},
		{"bad operator", func(m map[string]any) {
			spec(m)["workloads"] = []any{map[string]any{"labels": map[string]any{"matchExpressions": []any{map[string]any{"key": "a", "operator": "Near"}}}}}
		}, "operator"},
		{"too many workloads", func(m map[string]any) {
			var ws []any
			for range MaxWorkloads + 1 {
				ws = append(ws, map[string]any{"namespace": "a"})
			}
			spec(m)["workloads"] = ws
		}, "spec.workloads: Too many"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := valid()
			tt.edit(m)
			_, err := k.dyn.Resource(GVR).Create(context.Background(), &unstructured.Unstructured{Object: m}, metav1.CreateOptions{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	t.Run("valid", func(t *testing.T) {
		_, err := k.dyn.Resource(GVR).Create(context.Background(), &unstructured.Unstructured{Object: valid()}, metav1.CreateOptions{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = k.dyn.Resource(GVR).Delete(context.Background(), "kube-schema", metav1.DeleteOptions{}) })

		// kubectl get shows the printer columns.
		out := k.env.Kubectl(t).Must(nil, "get", "clustertrustpolicies", "kube-schema")
		for _, col := range []string{"READY", "REASON", "TRUSTDOMAINS", "MATCHED", "AGE", "partner.example"} {
			assert.Contains(t, out, col)
		}
	})
}

// Service account labels from the real API server: a relabel closes
// Changed and shows in Labels.
func TestKubeServiceAccountLabels(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	_, err := env.Client.CoreV1().ServiceAccounts(ns).Create(ctx, serviceAccount(ns, "api", map[string]string{"tier": "api"}), metav1.CreateOptions{})
	require.NoError(t, err)
	s := runLabels(t, env.Client)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, map[string]string{"tier": "api"}, s.Labels(ns, "api"))
	}, 30*time.Second, 20*time.Millisecond)

	ch := s.Changed()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		sa, err := env.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "api", metav1.GetOptions{})
		require.NoError(c, err)
		sa.Labels = map[string]string{"tier": "web"}
		_, err = env.Client.CoreV1().ServiceAccounts(ns).Update(ctx, sa, metav1.UpdateOptions{})
		assert.NoError(c, err)
	}, 10*time.Second, 20*time.Millisecond)
	waitChanged(t, ch, "a relabel")
	assert.Equal(t, map[string]string{"tier": "web"}, s.Labels(ns, "api"))

	// The labels a policy decides with.
	p, err := trustpolicy.Compile(local, trustpolicy.DefaultDeny, []trustpolicy.Rule{RuleOf("by-label", Spec{
		Workloads:    []WorkloadSelector{{Namespace: ns, Labels: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "web"}}}},
		TrustDomains: []TrustDomainGrant{{Name: "partner.example"}},
	})})
	require.NoError(t, err)
	id := local.ID().String() + "/ns/" + ns + "/sa/api"
	sub := trustpolicy.Subject{ID: spiffeid.RequireFromString(id), Namespace: ns, ServiceAccount: "api", Labels: s.Labels(ns, "api")}
	_, ok := p.Decide(sub).Allows(spiffeid.RequireTrustDomainFromString("partner.example"))
	assert.True(t, ok)
}

func TestKubeControllerStopsCleanly(t *testing.T) {
	_, dyn := kubeEnv(t)
	opts := goleak.IgnoreCurrent()
	c, err := New(Config{Dynamic: dyn, LocalTrustDomain: local, Apply: ApplyFunc(func([]trustpolicy.Rule) error { return nil })})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-c.Synced():
	case <-time.After(30 * time.Second):
		t.Fatal("never synced")
	}
	cancel()
	require.NoError(t, <-done)
	goleak.VerifyNone(t, opts, goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"), goleak.IgnoreAnyFunction("internal/poll.runtime_pollWait"))
}

func yamlToObject(doc string, out *map[string]any) error {
	return yaml.Unmarshal([]byte(strings.TrimSpace(doc)), out)
}

// The schema's limits are the controller's.
func TestSchemaLimitsMatch(t *testing.T) {
	data, err := os.ReadFile(crdPath)
	require.NoError(t, err)
	var crd map[string]any
	require.NoError(t, yaml.Unmarshal(data, &crd))
	versions, _, _ := unstructured.NestedSlice(crd, "spec", "versions")
	require.Len(t, versions, 1)
	schema, _, _ := unstructured.NestedMap(versions[0].(map[string]any), "schema", "openAPIV3Schema", "properties")
	maxItems := func(path ...string) int64 {
		full := []string{}
		for i, p := range path {
			if i > 0 {
				full = append(full, "properties")
			}
			full = append(full, p)
		}
		v, found, err := unstructured.NestedFieldNoCopy(schema, append(full, "maxItems")...)
		require.NoError(t, err)
		require.True(t, found, "%v has maxItems", path)
		return int64(v.(float64))
	}
	assert.EqualValues(t, MaxWorkloads, maxItems("spec", "workloads"))
	assert.EqualValues(t, MaxTrustDomains, maxItems("spec", "trustDomains"))
	assert.EqualValues(t, MaxRecent, maxItems("status", "matchedWorkloads", "recent"))
	assert.EqualValues(t, MaxConflicts, maxItems("status", "conflicts"))
	peers, _, _ := unstructured.NestedFieldNoCopy(schema, "spec", "properties", "trustDomains", "items", "properties", "peers", "maxItems")
	assert.EqualValues(t, MaxPeers, peers)
}
