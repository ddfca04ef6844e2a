package policycrd

import (
	"context"
	"errors"
	"fmt"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// unit drives one Controller's sync by hand over the dynamic fake client:
// what Run does on each informer event or tick, without the informer.
type unit struct {
	t        testing.TB
	dyn      *dynamicfake.FakeDynamicClient
	c        *Controller
	reg      *prometheus.Registry
	recorder *events.FakeRecorder
	clock    *clocktesting.FakeClock

	mu       sync.Mutex
	applies  [][]trustpolicy.Rule
	refuse   error
	matched  map[string][]string
	conflict map[string][]string
	leader   bool
}

func newUnit(t testing.TB) *unit {
	t.Helper()
	u := &unit{
		t:   t,
		dyn: kubetest.FakeDynamic(GVR, Kind+"List"),
		reg: prometheus.NewRegistry(), recorder: events.NewFakeRecorder(100), clock: clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0)),
		matched: map[string][]string{}, conflict: map[string][]string{}, leader: true,
	}
	c, err := New(Config{
		Dynamic: u.dyn, LocalTrustDomain: local, Clock: u.clock, Registerer: u.reg,
		Apply: ApplyFunc(func(rules []trustpolicy.Rule) error {
			u.mu.Lock()
			defer u.mu.Unlock()
			if u.refuse != nil {
				return u.refuse
			}
			u.applies = append(u.applies, rules)
			return nil
		}),
		Matched: func(rule string) (int, []string) {
			rule = strings.TrimPrefix(rule, RuleNamePrefix)
			u.mu.Lock()
			defer u.mu.Unlock()
			return len(u.matched[rule]), u.matched[rule]
		},
		Conflicts: func(rule string) []string {
			rule = strings.TrimPrefix(rule, RuleNamePrefix)
			u.mu.Lock()
			defer u.mu.Unlock()
			return u.conflict[rule]
		},
		IsLeader: func() bool {
			u.mu.Lock()
			defer u.mu.Unlock()
			return u.leader
		},
	})
	require.NoError(t, err)
	u.c = c
	return u
}

func (u *unit) sync() error {
	u.t.Helper()
	return u.c.rules.Sync(context.Background(), kubetest.Lister{Res: u.dyn.Resource(GVR)}, u.recorder)
}

func (u *unit) mustSync() {
	u.t.Helper()
	require.NoError(u.t, u.sync())
}

func specMap(t testing.TB, s Spec) map[string]any {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&s)
	require.NoError(t, err)
	return m
}

// put creates name or replaces its spec, bumping the generation as the
// API server would.
func (u *unit) put(name string, spec any) {
	u.t.Helper()
	if s, ok := spec.(Spec); ok {
		spec = specMap(u.t, s)
	}
	res := u.dyn.Resource(GVR)
	got, err := res.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": Group + "/" + Version, "kind": Kind,
			"metadata": map[string]any{"name": name, "generation": int64(1)}, "spec": spec,
		}}
		_, err = res.Create(context.Background(), obj, metav1.CreateOptions{})
		require.NoError(u.t, err)
		return
	}
	got.Object["spec"] = spec
	got.SetGeneration(got.GetGeneration() + 1)
	_, err = res.Update(context.Background(), got, metav1.UpdateOptions{})
	require.NoError(u.t, err)
}

func (u *unit) get(name string) ClusterTrustPolicy {
	u.t.Helper()
	obj, err := u.dyn.Resource(GVR).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(u.t, err)
	// The spec may not decode (TestSyncUndecodable); the status does.
	unstructured.RemoveNestedField(obj.Object, "spec")
	var cr ClusterTrustPolicy
	require.NoError(u.t, runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &cr))
	return cr
}

func (u *unit) ready(name string) metav1.Condition {
	u.t.Helper()
	cr := u.get(name)
	c := meta.FindStatusCondition(cr.Status.Conditions, ConditionReady)
	require.NotNil(u.t, c, "%s has no Ready condition: %+v", name, cr.Status)
	assert.Equal(u.t, cr.Generation, cr.Status.ObservedGeneration)
	return *c
}

// lastApplied is the names and granted trust domains of the last set
// Apply accepted.
func (u *unit) lastApplied() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	require.NotEmpty(u.t, u.applies, "nothing applied")
	return ruleList(u.applies[len(u.applies)-1]).names()
}

func (u *unit) applyCount() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.applies)
}

func (u *unit) drainEvents() []string {
	var out []string
	for {
		select {
		case e := <-u.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func (u *unit) states() map[string]float64 {
	out := map[string]float64{}
	for _, s := range []string{"applied", "invalid", "invalid_last_valid_applied", "conflict"} {
		out[s] = testutil.ToFloat64(u.c.metrics.Resources.WithLabelValues(s))
	}
	return out
}

func grant(tds ...string) Spec {
	s := Spec{Workloads: []WorkloadSelector{{SPIFFEID: "spiffe://example.org/ns/payments/*"}}}
	for _, td := range tds {
		s.TrustDomains = append(s.TrustDomains, TrustDomainGrant{Name: td})
	}
	return s
}

func TestSyncValidAndInvalid(t *testing.T) {
	u := newUnit(t)
	u.put("good", validSpec())
	bad := grant("partner.example")
	bad.TrustDomains[0].Peers = []string{"spiffe://elsewhere.example/x"}
	u.put("bad", bad)
	u.mu.Lock()
	u.matched["good"] = []string{"spiffe://example.org/ns/payments/sa/api"}
	u.mu.Unlock()
	u.mustSync()

	assert.Equal(t, []string{"good=partner.example,other.example"}, u.lastApplied(), "the invalid one is refused alone")
	u.mu.Lock()
	assert.Contains(t, u.applies[0], RuleOf("good", validSpec()))
	u.mu.Unlock()

	c := u.ready("good")
	assert.Equal(t, metav1.ConditionTrue, c.Status)
	assert.Equal(t, ReasonApplied, c.Reason)
	assert.Equal(t, "applied: grants partner.example, other.example", c.Message)
	st := u.get("good").Status
	assert.Equal(t, []string{"partner.example", "other.example"}, st.TrustDomains)
	assert.Equal(t, &MatchedWorkloads{Count: 1, Recent: []string{"spiffe://example.org/ns/payments/sa/api"}}, st.MatchedWorkloads)

	c = u.ready("bad")
	assert.Equal(t, metav1.ConditionFalse, c.Status)
	assert.Equal(t, ReasonInvalid, c.Reason)
	assert.Contains(t, c.Message, `spec.trustDomains[0].peers[0]: "spiffe://elsewhere.example/x" is not in trust domain "partner.example"`)
	assert.Empty(t, u.get("bad").Status.TrustDomains, "nothing of it applies")

	evs := u.drainEvents()
	require.Len(t, evs, 1)
	assert.Contains(t, evs[0], "Warning Invalid spec.trustDomains[0].peers[0]")
	assert.Equal(t, map[string]float64{"applied": 1, "invalid": 1, "invalid_last_valid_applied": 0, "conflict": 0}, u.states())

	// Nothing changed: no Apply (which would wake every SDS stream), no
	// status write, no second event.
	writes := testutil.ToFloat64(u.c.metrics.StatusWrites)
	u.clock.Step(time.Hour)
	u.mustSync()
	assert.Equal(t, 1, u.applyCount())
	assert.Equal(t, writes, testutil.ToFloat64(u.c.metrics.StatusWrites))
	assert.Empty(t, u.drainEvents())
}

func TestSyncKeepsLastGood(t *testing.T) {
	u := newUnit(t)
	u.put("r", grant("partner.example"))
	u.mustSync()
	assert.Equal(t, []string{"r=partner.example"}, u.lastApplied())

	// Generation 2 is invalid: generation 1 stays applied, and says so.
	u.put("r", grant("example.org"))
	u.mustSync()
	assert.Equal(t, []string{"r=partner.example"}, u.lastApplied())
	c := u.ready("r")
	assert.Equal(t, ReasonInvalid, c.Reason)
	assert.Equal(t, `spec.trustDomains[0].name: trust domain "example.org" is the local one, which every workload trusts; rules grant federated trust domains; generation 1 stays applied`, c.Message)
	assert.Equal(t, []string{"partner.example"}, u.get("r").Status.TrustDomains, "what is in force")
	assert.Equal(t, 1.0, u.states()["invalid_last_valid_applied"])
	evs := u.drainEvents()
	require.Len(t, evs, 1)
	assert.Contains(t, evs[0], "generation 1 stays applied")

	// Generation 3 fixes it.
	u.put("r", grant("partner.example", "other.example"))
	u.mustSync()
	assert.Equal(t, []string{"r=partner.example,other.example"}, u.lastApplied())
	assert.Equal(t, ReasonApplied, u.ready("r").Reason)

	// Deleted: its rule goes.
	require.NoError(t, u.dyn.Resource(GVR).Delete(context.Background(), "r", metav1.DeleteOptions{}))
	u.mustSync()
	assert.Empty(t, u.lastApplied())
	assert.Empty(t, u.c.Rules())
}

// A resource that does not decode (only without the CRD's schema) is
// refused like an invalid one.
func TestSyncUndecodable(t *testing.T) {
	u := newUnit(t)
	u.put("odd", map[string]any{"workloads": "everyone", "trustDomains": []any{}})
	u.mustSync()
	c := u.ready("odd")
	assert.Equal(t, ReasonInvalid, c.Reason)
	assert.Contains(t, c.Message, "spec does not decode")
	assert.Empty(t, u.lastApplied(), "the first sync applies the empty set: the CRD source is known empty")
	select {
	case <-u.c.Synced():
	default:
		t.Fatal("Synced not closed after the first Apply")
	}
}

// When the policy refuses the set (a file rule of the same name, say), the
// set it last accepted stays in force: the rules in it stay Applied, a new
// one is Conflict, and sync fails so that it is retried.
func TestSyncApplyRefused(t *testing.T) {
	u := newUnit(t)
	u.put("old", grant("partner.example"))
	u.mustSync()

	u.mu.Lock()
	u.refuse = errors.New(`rule "new" (crd:new): name already used by the rule at file:/etc/policy.yaml:3`)
	u.mu.Unlock()
	u.put("new", grant("other.example"))
	err := u.sync()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "name already used")
	assert.Equal(t, ReasonApplied, u.ready("old").Reason)
	c := u.ready("new")
	assert.Equal(t, metav1.ConditionFalse, c.Status)
	assert.Equal(t, ReasonConflict, c.Reason)
	assert.Contains(t, c.Message, "not applied: ")
	assert.Contains(t, c.Message, "file:/etc/policy.yaml:3")
	assert.Empty(t, u.get("new").Status.TrustDomains)
	assert.Equal(t, []string{"old=partner.example"}, ruleList(u.c.Rules()).names())
	assert.Equal(t, map[string]float64{"applied": 1, "invalid": 0, "invalid_last_valid_applied": 0, "conflict": 1}, u.states())
	require.Len(t, u.drainEvents(), 1)

	u.mu.Lock()
	u.refuse = nil
	u.mu.Unlock()
	u.mustSync()
	assert.Equal(t, ReasonApplied, u.ready("new").Reason)
	assert.Equal(t, []string{"new=other.example", "old=partner.example"}, u.lastApplied())
}

// Matched workloads and conflicts follow what the consumer reports, on
// the next sync (Run's tick), bounded.
func TestSyncStatusFollowsMatches(t *testing.T) {
	u := newUnit(t)
	u.put("r", grant("partner.example"))
	u.mustSync()
	assert.Equal(t, &MatchedWorkloads{}, u.get("r").Status.MatchedWorkloads)

	var ids []string
	for i := range 30 {
		ids = append(ids, fmt.Sprintf("spiffe://example.org/ns/payments/sa/w%d", i))
	}
	u.mu.Lock()
	u.matched["r"] = ids
	u.conflict["r"] = []string{"also granted by rule x with other peers"}
	u.mu.Unlock()
	u.mustSync()
	st := u.get("r").Status
	assert.Equal(t, int64(30), st.MatchedWorkloads.Count)
	assert.Equal(t, ids[:MaxRecent], st.MatchedWorkloads.Recent)
	assert.Equal(t, []string{"also granted by rule x with other peers"}, st.Conflicts)
	assert.Equal(t, ReasonApplied, u.ready("r").Reason, "a reported conflict does not stop the rule")
	assert.Equal(t, 1, u.applyCount(), "a status refresh applies nothing")
}

// Followers apply (their SDS streams follow the same policy) but write
// neither statuses nor events.
func TestSyncFollower(t *testing.T) {
	u := newUnit(t)
	u.mu.Lock()
	u.leader = false
	u.mu.Unlock()
	u.put("r", grant("partner.example"))
	u.put("bad", grant("example.org"))
	u.mustSync()
	assert.Equal(t, []string{"r=partner.example"}, u.lastApplied())
	assert.Empty(t, u.get("r").Status.Conditions)
	assert.Empty(t, u.drainEvents())
	assert.Zero(t, testutil.ToFloat64(u.c.metrics.StatusWrites))
}

func TestConditionTransitionTimeKept(t *testing.T) {
	u := newUnit(t)
	u.put("r", grant("partner.example"))
	u.mustSync()
	first := u.ready("r").LastTransitionTime
	u.clock.Step(time.Minute)
	u.mu.Lock()
	u.matched["r"] = []string{"spiffe://example.org/ns/payments/sa/a"}
	u.mu.Unlock()
	u.mustSync()
	assert.True(t, first.Equal(ptr(u.ready("r").LastTransitionTime)), "still Ready=True: the transition time stays")
	u.put("r", grant("example.org"))
	u.mustSync()
	assert.True(t, u.ready("r").LastTransitionTime.After(first.Time))
}

func ptr[T any](v T) *T { return &v }

func TestNewRequires(t *testing.T) {
	_, err := New(Config{})
	require.Error(t, err)
	_, err = New(Config{Dynamic: newUnit(t).dyn, Apply: ApplyFunc(func([]trustpolicy.Rule) error { return nil })})
	assert.ErrorContains(t, err, "LocalTrustDomain")
}

// An invalid resource with no valid generation to keep (as after a
// restart) grants nothing but keeps the trust domains it names governed,
// so they do not fall to the default and reach every workload.
func TestSyncInvalidStillGoverns(t *testing.T) {
	u := newUnit(t)
	bad := grant("partner.example", "spiffe://not-a-name", "example.org")
	bad.TrustDomains[0].Peers = []string{"spiffe://elsewhere.example/x"}
	u.put("bad", bad)
	u.mustSync()
	u.mu.Lock()
	applied := u.applies[len(u.applies)-1]
	u.mu.Unlock()
	require.Len(t, applied, 1)
	assert.Equal(t, trustpolicy.Rule{Name: "clustertrustpolicy/bad", Origin: "crd:bad", GovernOnly: true,
		TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: "partner.example"}}}, applied[0])
	p, err := trustpolicy.Compile(local, trustpolicy.DefaultAllow, applied)
	require.NoError(t, err)
	_, ok := p.Decide(trustpolicy.Subject{ID: spiffeid.RequireFromString("spiffe://example.org/ns/payments/sa/api")}).Allows(spiffeid.RequireTrustDomainFromString("partner.example"))
	assert.False(t, ok, "governed, granted to nobody")

	c := u.ready("bad")
	assert.Equal(t, ReasonInvalid, c.Reason)
	assert.Contains(t, c.Message, "grants nothing")
	assert.Empty(t, u.get("bad").Status.TrustDomains)
	assert.Equal(t, 1.0, u.states()["invalid"])
}

type ruleList []trustpolicy.Rule

func (rs ruleList) names() []string {
	var out []string
	for _, r := range rs {
		if r.GovernOnly {
			continue // the stand-in of an invalid resource: TestSyncInvalidStillGoverns
		}
		var tds []string
		for _, g := range r.TrustDomains {
			tds = append(tds, g.TrustDomain)
		}
		out = append(out, strings.TrimPrefix(r.Name, RuleNamePrefix)+"="+strings.Join(tds, ","))
	}
	slices.Sort(out)
	return out
}

// Synced waits for a set the policy accepted: a refused first set leaves
// workloads without what resources grant them.
func TestSyncedWaitsForAcceptedSet(t *testing.T) {
	u := newUnit(t)
	u.mu.Lock()
	u.refuse = errors.New("refused")
	u.mu.Unlock()
	u.put("r", grant("partner.example"))
	require.Error(t, u.sync())
	select {
	case <-u.c.Synced():
		t.Fatal("Synced closed before any set was accepted")
	default:
	}
	assert.Equal(t, ReasonConflict, u.ready("r").Reason)
	u.mu.Lock()
	u.refuse = nil
	u.mu.Unlock()
	u.mustSync()
	<-u.c.Synced()
	assert.Equal(t, ReasonApplied, u.ready("r").Reason)
}

type staticLister []runtime.Object

func (l staticLister) List(labels.Selector) ([]runtime.Object, error) { return l, nil }

// BenchmarkSyncUnchanged is what every tick costs with 1,000 resources
// whose statuses are current: a check of each rule, no Apply, no write.
func BenchmarkSyncUnchanged(b *testing.B) {
	u := newUnit(b)
	for i := range 1000 {
		s := validSpec()
		s.Workloads[0].SPIFFEID = fmt.Sprintf("spiffe://example.org/ns/team%d/*", i)
		u.put(fmt.Sprintf("rule-%04d", i), s)
	}
	if err := u.sync(); err != nil {
		b.Fatal(err)
	}
	objs, err := kubetest.Lister{Res: u.dyn.Resource(GVR)}.List(nil)
	if err != nil {
		b.Fatal(err)
	}
	writes, applies := testutil.ToFloat64(u.c.metrics.StatusWrites), u.applyCount()
	b.ReportAllocs()
	for b.Loop() {
		if err := u.c.rules.Sync(context.Background(), staticLister(objs), u.recorder); err != nil {
			b.Fatal(err)
		}
	}
	if testutil.ToFloat64(u.c.metrics.StatusWrites) != writes || u.applyCount() != applies {
		b.Fatal("an unchanged sync wrote or applied")
	}
}
