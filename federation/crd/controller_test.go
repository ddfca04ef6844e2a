package crd

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// TestMain fails the tests if a goroutine outlives them (the controller's Run loop and its informers), once the
// shared API server is stopped.
func TestMain(m *testing.M) { goleak.VerifyTestMain(kubetest.Tests(m)) }

// env is the shared API server with the CRD from deploy/base installed.
func env(t *testing.T) (*kubetest.Env, dynamic.Interface) {
	t.Helper()
	e := kubetest.Shared(t)
	return e, e.InstallCRD(t, filepath.Join("..", "..", "deploy", "base", "crd.yaml"))
}

// fixture runs a controller over the resources of one class.
type fixture struct {
	t       *testing.T
	dyn     dynamic.Interface
	env     *kubetest.Env
	class   string
	clock   *clocktesting.FakeClock
	mu      sync.Mutex
	applied []federation.Endpoint
	applies int
	status  []federation.Status
	leader  bool
	ctrl    *Controller
}

func newFixture(t *testing.T, mutate func(*Config)) *fixture {
	t.Helper()
	e, dyn := env(t)
	f := &fixture{t: t, dyn: dyn, env: e, class: strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())),
		clock: clocktesting.NewFakeClock(time.Now()), leader: true}
	cfg := Config{
		Dynamic: dyn, Events: e.Client, LocalTrustDomain: spiffeid.RequireTrustDomainFromString("local.test"),
		ClassName: f.class,
		Apply: func(eps []federation.Endpoint) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.applied, f.applies = eps, f.applies+1
			return nil
		},
		Status: func() []federation.Status {
			f.mu.Lock()
			defer f.mu.Unlock()
			return slices.Clone(f.status)
		},
		IsLeader: func() bool {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.leader
		},
		Clock: f.clock,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := New(cfg)
	require.NoError(t, err)
	f.ctrl = c
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return f
}

func (f *fixture) endpoints() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []string{}
	for _, ep := range f.applied {
		out = append(out, ep.String())
	}
	sort.Strings(out)
	return out
}

func (f *fixture) waitApplied(want ...string) {
	f.t.Helper()
	sort.Strings(want)
	if want == nil {
		want = []string{}
	}
	require.Eventually(f.t, func() bool { return assert.ObjectsAreEqual(want, f.endpoints()) }, 20*time.Second, 20*time.Millisecond,
		"applied: %v, want %v", f.endpoints(), want)
}

func (f *fixture) spec(td, url string) map[string]any {
	return map[string]any{"trustDomain": td, "bundleEndpointURL": url, "bundleEndpointProfile": map[string]any{"type": "https_web"}, "className": f.class}
}

func (f *fixture) create(name string, spec map[string]any) error {
	f.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/" + Version, "kind": Kind,
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
	_, err := f.dyn.Resource(GVR).Create(context.Background(), u, metav1.CreateOptions{})
	if err == nil {
		f.t.Cleanup(func() { _ = f.dyn.Resource(GVR).Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	return err
}

func (f *fixture) update(name string, edit func(spec map[string]any)) {
	f.t.Helper()
	require.EventuallyWithT(f.t, func(c *assert.CollectT) {
		u, err := f.dyn.Resource(GVR).Get(context.Background(), name, metav1.GetOptions{})
		require.NoError(c, err)
		spec := u.Object["spec"].(map[string]any)
		edit(spec)
		_, err = f.dyn.Resource(GVR).Update(context.Background(), u, metav1.UpdateOptions{})
		assert.NoError(c, err, "update (a conflict is retried)")
	}, 10*time.Second, 20*time.Millisecond)
}

func (f *fixture) get(name string) ClusterFederatedTrustDomain {
	f.t.Helper()
	u, err := f.dyn.Resource(GVR).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(f.t, err)
	var cr ClusterFederatedTrustDomain
	require.NoError(f.t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cr))
	return cr
}

// waitCondition waits for name's Ready condition to have status and reason.
func (f *fixture) waitReady(name string, status metav1.ConditionStatus, reason string) ClusterFederatedTrustDomain {
	f.t.Helper()
	var cr ClusterFederatedTrustDomain
	require.Eventually(f.t, func() bool {
		cr = f.get(name)
		c := meta.FindStatusCondition(cr.Status.Conditions, ConditionReady)
		return c != nil && c.Status == status && c.Reason == reason && cr.Status.ObservedGeneration == cr.Generation
	}, 20*time.Second, 20*time.Millisecond, "%s never Ready=%s/%s: %+v", name, status, reason, cr.Status)
	return cr
}

// tick makes the controller re-derive statuses now.
func (f *fixture) tick() {
	f.t.Helper()
	require.Eventually(f.t, f.clock.HasWaiters, 10*time.Second, 10*time.Millisecond)
	f.clock.Step(DefaultStatusInterval)
}

func (f *fixture) events(name string) []string {
	f.t.Helper()
	list, err := f.env.Client.EventsV1().Events("default").List(context.Background(), metav1.ListOptions{})
	require.NoError(f.t, err)
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Name == name && e.Regarding.Kind == Kind {
			out = append(out, e.Reason+": "+e.Note)
		}
	}
	return out
}

func TestControllerLifecycle(t *testing.T) {
	f := newFixture(t, nil)
	name := f.class + "-west"
	require.NoError(t, f.create(name, f.spec("west.test", "https://west.test/bundle")))
	f.waitApplied("west.test|https://west.test/bundle")
	cr := f.waitReady(name, metav1.ConditionFalse, ReasonPending)
	assert.Equal(t, "pending", cr.Status.State)
	assert.Equal(t, map[spiffeid.TrustDomain]string{spiffeid.RequireTrustDomainFromString("west.test"): "crd:" + name}, f.ctrl.Origins())

	// The poller fetched it: the status shows what /v1/federation shows.
	now := time.Now().UTC()
	seq := uint64(42)
	notAfter := now.Add(48 * time.Hour)
	f.mu.Lock()
	f.status = []federation.Status{{TrustDomain: "west.test", EndpointURL: "https://west.test/bundle", State: federation.StateOK,
		Sequence: &seq, LastSuccess: &now, LastAttempt: &now, NextRefresh: &notAfter,
		Authorities: []federation.AuthorityInfo{{Kind: federation.AuthorityX509, SHA256: "ab", Subject: "CN=west", NotAfter: &notAfter}}}}
	f.mu.Unlock()
	f.tick()
	cr = f.waitReady(name, metav1.ConditionTrue, ReasonFetched)
	assert.Equal(t, "ok", cr.Status.State)
	assert.Equal(t, int64(42), *cr.Status.Sequence)
	require.Len(t, cr.Status.Authorities, 1)
	assert.Equal(t, "CN=west", cr.Status.Authorities[0].Subject)
	assert.Equal(t, notAfter.Truncate(time.Second), cr.Status.Authorities[0].NotAfter.UTC())
	stale := meta.FindStatusCondition(cr.Status.Conditions, ConditionStale)
	require.NotNil(t, stale)
	assert.Equal(t, metav1.ConditionFalse, stale.Status)

	// Stale.
	f.mu.Lock()
	f.status[0].State = federation.StateStale
	f.status[0].LastError = "timeout"
	f.mu.Unlock()
	f.tick()
	cr = f.waitReady(name, metav1.ConditionFalse, ReasonStale)
	assert.Equal(t, metav1.ConditionTrue, meta.FindStatusCondition(cr.Status.Conditions, ConditionStale).Status)

	// Edited to a new URL: applied.
	f.update(name, func(s map[string]any) { s["bundleEndpointURL"] = "https://west2.test/" })
	f.waitApplied("west.test|https://west2.test/")

	// Edited to an invalid spec (schema-valid, but not a bundle): refused
	// with a condition and an event; the last valid generation stays.
	f.update(name, func(s map[string]any) { s["trustDomainBundle"] = "{not json" })
	cr = f.waitReady(name, metav1.ConditionFalse, ReasonInvalidSpec)
	msg := meta.FindStatusCondition(cr.Status.Conditions, ConditionReady).Message
	assert.Contains(t, msg, "trustDomainBundle")
	assert.Contains(t, msg, fmt.Sprintf("generation %d stays applied", cr.Generation-1))
	assert.Equal(t, []string{"west.test|https://west2.test/"}, f.endpoints())
	require.Eventually(t, func() bool { return len(f.events(name)) > 0 }, 20*time.Second, 50*time.Millisecond)
	assert.Contains(t, f.events(name)[0], "InvalidSpec: ")

	// Deleted: its endpoint goes.
	require.NoError(t, f.dyn.Resource(GVR).Delete(context.Background(), name, metav1.DeleteOptions{}))
	f.waitApplied()
	assert.Empty(t, f.ctrl.Origins())
}

func TestControllerBootstrapBundle(t *testing.T) {
	f := newFixture(t, nil)
	ca := testca.New(t, "east.test")
	doc, err := bundledoc.Marshal(ca.Bundle())
	require.NoError(t, err)
	spec := f.spec("east.test", "https://east.test/")
	spec["bundleEndpointProfile"] = map[string]any{"type": "https_spiffe", "endpointSPIFFEID": "spiffe://east.test/trustbridge"}
	spec["trustDomainBundle"] = string(doc)
	spec["refresh"] = map[string]any{"min": "30s", "max": "10m"}
	require.NoError(t, f.create(f.class+"-east", spec))
	f.waitApplied("east.test|https://east.test/|spiffe://east.test/trustbridge")
	f.mu.Lock()
	ep := f.applied[0]
	f.mu.Unlock()
	require.NotNil(t, ep.BootstrapBundle)
	assert.True(t, ep.BootstrapBundle.X509Authorities()[0].Equal(ca.Cert))
	assert.Equal(t, federation.Refresh{Min: 30 * time.Second, Max: 10 * time.Minute}, ep.Refresh)
}

func TestControllerConflicts(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.Reserved = map[spiffeid.TrustDomain]string{spiffeid.RequireTrustDomainFromString("flagged.test"): "--federate"}
	})
	first, second := f.class+"-a", f.class+"-b"
	require.NoError(t, f.create(first, f.spec("dup.test", "https://one.test/")))
	f.waitApplied("dup.test|https://one.test/")
	require.NoError(t, f.create(second, f.spec("dup.test", "https://two.test/")))
	cr := f.waitReady(second, metav1.ConditionFalse, ReasonConflict)
	assert.Contains(t, meta.FindStatusCondition(cr.Status.Conditions, ConditionReady).Message, first)
	assert.Equal(t, StateInvalid, cr.Status.State)
	assert.Equal(t, []string{"dup.test|https://one.test/"}, f.endpoints(), "the older one wins")

	// Deleting the older one lets the other take over.
	require.NoError(t, f.dyn.Resource(GVR).Delete(context.Background(), first, metav1.DeleteOptions{}))
	f.waitApplied("dup.test|https://two.test/")

	reserved := f.class + "-flagged"
	require.NoError(t, f.create(reserved, f.spec("flagged.test", "https://flagged.test/")))
	cr = f.waitReady(reserved, metav1.ConditionFalse, ReasonConflict)
	assert.Contains(t, meta.FindStatusCondition(cr.Status.Conditions, ConditionReady).Message, "--federate")

	own := f.class + "-own"
	require.NoError(t, f.create(own, f.spec("local.test", "https://local.test/")))
	cr = f.waitReady(own, metav1.ConditionFalse, ReasonInvalidSpec)
	assert.Contains(t, meta.FindStatusCondition(cr.Status.Conditions, ConditionReady).Message, "own trust domain")
	assert.Equal(t, []string{"dup.test|https://two.test/"}, f.endpoints())
}

func TestControllerIgnoresOtherClasses(t *testing.T) {
	f := newFixture(t, nil)
	spec := f.spec("other.test", "https://other.test/")
	spec["className"] = "someone-else"
	require.NoError(t, f.create(f.class+"-other", spec))
	mine := f.class + "-mine"
	require.NoError(t, f.create(mine, f.spec("mine.test", "https://mine.test/")))
	f.waitApplied("mine.test|https://mine.test/")
	f.waitReady(mine, metav1.ConditionFalse, ReasonPending)
	assert.Empty(t, f.get(f.class+"-other").Status.Conditions, "not ours: no status either")
}

func TestControllerFollowerWritesNothing(t *testing.T) {
	f := newFixture(t, nil)
	f.mu.Lock()
	f.leader = false
	f.mu.Unlock()
	name := f.class + "-w"
	require.NoError(t, f.create(name, f.spec("follower.test", "https://follower.test/")))
	f.waitApplied("follower.test|https://follower.test/")
	f.tick()
	f.tick()
	assert.Empty(t, f.get(name).Status.Conditions, "followers apply but do not write status")

	f.mu.Lock()
	f.leader = true
	f.mu.Unlock()
	f.tick()
	f.waitReady(name, metav1.ConditionFalse, ReasonPending)
}

// The schema refuses at admission what can be refused there.
func TestSchemaValidation(t *testing.T) {
	_, dyn := env(t)
	f := &fixture{t: t, dyn: dyn, class: "schema"}
	for _, tc := range []struct {
		name string
		edit func(map[string]any)
		want string
	}{
		{"plain http", func(s map[string]any) { s["bundleEndpointURL"] = "http://x.test/" }, "bundleEndpointURL"},
		{"user info", func(s map[string]any) { s["bundleEndpointURL"] = "https://user@x.test/" }, "bundleEndpointURL"},
		{"spiffe without ID", func(s map[string]any) { s["bundleEndpointProfile"] = map[string]any{"type": "https_spiffe"} }, "endpointSPIFFEID is required"},
		{"web with ID", func(s map[string]any) {
			s["bundleEndpointProfile"] = map[string]any{"type": "https_web", "endpointSPIFFEID": "spiffe://x.test/s"}
		}, "not allowed with https_web"},
		{"unknown profile", func(s map[string]any) { s["bundleEndpointProfile"] = map[string]any{"type": "https_ftp"} }, "Unsupported value"},
		{"upper-case trust domain", func(s map[string]any) { s["trustDomain"] = "X.test" }, "trustDomain"},
		{"bad duration", func(s map[string]any) { s["refresh"] = map[string]any{"min": "soon"} }, "refresh.min"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := f.spec("x.test", "https://x.test/")
			tc.edit(spec)
			err := f.create("schema-"+strings.ReplaceAll(tc.name, " ", "-"), spec)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	require.NoError(t, f.create("schema-valid", f.spec("x.test", "https://x.test/")))
}

func TestControllerStopsCleanly(t *testing.T) {
	_, dyn := env(t)
	opts := goleak.IgnoreCurrent()
	c, err := New(Config{Dynamic: dyn, Apply: func([]federation.Endpoint) error { return nil },
		Status: func() []federation.Status { return nil }, ClassName: "leak"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	require.Eventually(t, func() bool { return c.metrics != nil }, time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	goleak.VerifyNone(t, opts, goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"), goleak.IgnoreAnyFunction("internal/poll.runtime_pollWait"))
}

func TestEndpointFromSpec(t *testing.T) {
	ep, warnings, err := Endpoint(Spec{TrustDomain: "a.test", BundleEndpointURL: "https://a.test/", BundleEndpointProfile: Profile{Type: "https_web"}})
	require.NoError(t, err)
	assert.Empty(t, warnings)
	assert.Equal(t, "a.test|https://a.test/", ep.String())
	for _, tc := range []struct {
		spec Spec
		want string
	}{
		{Spec{TrustDomain: "A", BundleEndpointURL: "https://a/", BundleEndpointProfile: Profile{Type: "https_web"}}, `trustDomain "A"`},
		{Spec{TrustDomain: "a.test", BundleEndpointURL: "http://a/", BundleEndpointProfile: Profile{Type: "https_web"}}, "scheme must be https"},
		{Spec{TrustDomain: "a.test", BundleEndpointURL: "https://a/", BundleEndpointProfile: Profile{Type: "https_spiffe"}}, "requires endpointSPIFFEID"},
		{Spec{TrustDomain: "a.test", BundleEndpointURL: "https://a/", BundleEndpointProfile: Profile{Type: "https_web"}, TrustDomainBundle: "{"}, "trustDomainBundle"},
		{Spec{TrustDomain: "a.test", BundleEndpointURL: "https://a/", BundleEndpointProfile: Profile{Type: "https_web"}, Refresh: &RefreshBounds{Min: "1x"}}, "refresh.min"},
	} {
		_, _, err := Endpoint(tc.spec)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
		assert.NotContains(t, err.Error(), "line 1", "file positions mean nothing in a resource")
	}
}

func FuzzEndpoint(f *testing.F) {
	f.Add("a.test", "https://a.test/", "https_web", "", "", "30s")
	f.Add("a.test", "https://a.test/", "https_spiffe", "spiffe://a.test/x", `{"keys":[]}`, "")
	f.Fuzz(func(t *testing.T, td, url, profile, id, bundle, min string) {
		spec := Spec{TrustDomain: td, BundleEndpointURL: url, BundleEndpointProfile: Profile{Type: profile, EndpointSPIFFEID: id},
			TrustDomainBundle: bundle, Refresh: &RefreshBounds{Min: min}}
		ep, _, err := Endpoint(spec)
		if err != nil {
			return
		}
		// What is accepted is a valid endpoint for exactly that trust domain.
		if ep.TrustDomain.Name() != td || ep.URL.Scheme != "https" {
			t.Fatalf("accepted %+v for %q", ep, td)
		}
		if _, err := federation.MergeEndpoints([]federation.Endpoint{ep}); err != nil {
			t.Fatal(err)
		}
		_, _ = json.Marshal(spec)
	})
}
