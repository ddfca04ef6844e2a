package distribution

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trustbridge/trustbridge/internal/testkit/testlog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// verifyNoLeaks checks, when the test ends (after every later-registered
// cleanup, such as stopping controllers), that no goroutine the test
// started is left.
func verifyNoLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

func namespace(name string, lbls map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}}
}

func configMap(ns, name string, lbls, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls}, Data: data}
}

var ours = map[string]string{ManagedByLabel: ManagedByValue}

func TestNew(t *testing.T) {
	client := fake.NewClientset()
	store := trust.NewStore()
	td := spiffeid.RequireTrustDomainFromString(localTD)
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "defaults", cfg: Config{Client: client, Store: store, TrustDomain: td}},
		{name: "no client", cfg: Config{Store: store, TrustDomain: td}, wantErr: "no Kubernetes client"},
		{name: "no store", cfg: Config{Client: client, TrustDomain: td}, wantErr: "no trust store"},
		{name: "no trust domain", cfg: Config{Client: client, Store: store}, wantErr: "no local trust domain"},
		{name: "bad name", cfg: Config{Client: client, Store: store, TrustDomain: td, Name: "Not_A_Name"}, wantErr: `ConfigMap name "Not_A_Name"`},
		{name: "negative workers", cfg: Config{Client: client, Store: store, TrustDomain: td, Workers: -1}, wantErr: "workers must not be negative"},
		{name: "negative resync", cfg: Config{Client: client, Store: store, TrustDomain: td, Resync: -1}, wantErr: "resync period must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(tt.cfg)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				assert.ErrorContains(t, err, "distribution: ")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, DefaultName, c.cfg.Name)
			assert.Equal(t, DefaultWorkers, c.cfg.Workers)
			assert.Equal(t, DefaultResync, c.cfg.Resync)
			assert.True(t, c.cfg.NamespaceSelector.Empty())
			assert.EqualError(t, c.Ready(), "distribution: not running")
		})
	}

	t.Run("metrics registered twice", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		_, err := New(Config{Client: client, Store: store, TrustDomain: td, Registerer: reg})
		require.NoError(t, err)
		_, err = New(Config{Client: client, Store: store, TrustDomain: td, Registerer: reg})
		require.ErrorContains(t, err, "distribution: register metrics")
	})
}

// TestControllerFake drives the controller against the fake clientset,
// which applies no selectors: the controller's own checks must keep it to
// the selected namespaces and its own ConfigMap name.
func TestControllerFake(t *testing.T) {
	verifyNoLeaks(t)
	store, _ := newStore(t, "b.example")
	selected := map[string]string{"trust": "yes"}
	client := fake.NewClientset(
		namespace("selected", selected),
		namespace("other", nil),
		namespace("foreign", selected),
		namespace("stale", nil),
		namespace("terminating", selected),
		configMap("foreign", DefaultName, nil, map[string]string{"someone": "else"}),
		configMap("stale", DefaultName, ours, map[string]string{KeyRootCert: "old"}),
		configMap("other", DefaultName, nil, map[string]string{"not": "ours"}),
		configMap("selected", "unrelated", ours, map[string]string{"keep": "me"}),
	)
	terminating, err := client.CoreV1().Namespaces().Get(context.Background(), "terminating", metav1.GetOptions{})
	require.NoError(t, err)
	terminating.DeletionTimestamp = &metav1.Time{Time: terminating.CreationTimestamp.Time}
	_, err = client.CoreV1().Namespaces().Update(context.Background(), terminating, metav1.UpdateOptions{})
	require.NoError(t, err)

	var logs testlog.Buffer
	reg := prometheus.NewRegistry()
	c, err := New(Config{
		Client: client, Store: store, TrustDomain: spiffeid.RequireTrustDomainFromString(localTD),
		NamespaceSelector: labels.SelectorFromSet(selected),
		Logger:            slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registerer:        reg,
	})
	require.NoError(t, err)
	stop := startController(t, c)

	want, _, err := render(store.Snapshot(), c.cfg.TrustDomain, maxConfigMapBytes)
	require.NoError(t, err)
	ctx := context.Background()
	get := func(ns, name string) (*corev1.ConfigMap, error) {
		return client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	}
	require.Eventually(t, func() bool {
		cm, err := get("selected", DefaultName)
		return err == nil && assert.ObjectsAreEqual(want, cm.Data)
	}, waitFor, tick, "selected namespace gets the ConfigMap")
	require.Eventually(t, func() bool {
		_, err := get("stale", DefaultName)
		return apierrors.IsNotFound(err)
	}, waitFor, tick, "our ConfigMap in a namespace no longer selected is deleted")
	require.NoError(t, c.Ready())
	require.Eventually(t, func() bool {
		return metricValue(t, reg, "trustbridge_distribution_foreign_configmaps_total", nil) >= 1 &&
			metricValue(t, reg, "trustbridge_distribution_writes_total", map[string]string{"result": resultCreated}) == 1 &&
			metricValue(t, reg, "trustbridge_distribution_writes_total", map[string]string{"result": resultDeleted}) == 1
	}, waitFor, tick)

	cm, err := get("selected", DefaultName)
	require.NoError(t, err)
	assert.Equal(t, ours, cm.Labels)
	cm, err = get("foreign", DefaultName)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"someone": "else"}, cm.Data, "a ConfigMap we do not own is left alone")
	cm, err = get("other", DefaultName)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"not": "ours"}, cm.Data)
	cm, err = get("selected", "unrelated")
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"keep": "me"}, cm.Data, "other names are not ours to manage")
	_, err = get("terminating", DefaultName)
	assert.True(t, apierrors.IsNotFound(err), "nothing is created in a terminating namespace")

	assert.Equal(t, 0.0, metricValue(t, reg, "trustbridge_distribution_writes_total", map[string]string{"result": resultError}))
	// The states are counted from the informer caches at scrape time, and
	// the cache hears of our write after the write counter moved.
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, 1.0, metricValue(c, reg, "trustbridge_distribution_namespaces", map[string]string{"state": stateCurrent}))
		assert.Equal(c, 1.0, metricValue(c, reg, "trustbridge_distribution_namespaces", map[string]string{"state": stateForeign}))
		assert.Equal(c, 0.0, metricValue(c, reg, "trustbridge_distribution_namespaces", map[string]string{"state": statePending}))
	}, waitFor, tick)
	assert.Greater(t, metricValue(t, reg, "trustbridge_distribution_last_sync_timestamp_seconds", nil), 0.0)
	// The metric moves just before the log line is written.
	assert.Eventually(t, func() bool { return strings.Contains(logs.String(), "not managed by trustbridge") }, waitFor, tick, "logged")

	stop()
	assert.EqualError(t, c.Ready(), "distribution: not running")
	assert.Equal(t, -1.0, metricValue(t, reg, "trustbridge_distribution_namespaces", map[string]string{"state": stateCurrent}),
		"no state gauge without a running controller")
}

func TestControllerConflictRetried(t *testing.T) {
	verifyNoLeaks(t)
	store, _ := newStore(t)
	client := fake.NewClientset(
		namespace("ns", nil),
		configMap("ns", DefaultName, ours, map[string]string{KeyRootCert: "stale"}),
	)
	var conflicts atomic.Int32
	client.PrependReactor("update", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts.Add(1) == 1 {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, DefaultName, assert.AnError)
		}
		return false, nil, nil
	})
	reg := prometheus.NewRegistry()
	c, err := New(Config{Client: client, Store: store, TrustDomain: spiffeid.RequireTrustDomainFromString(localTD), Registerer: reg})
	require.NoError(t, err)
	startController(t, c)

	want, _, err := render(store.Snapshot(), c.cfg.TrustDomain, maxConfigMapBytes)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		cm, err := client.CoreV1().ConfigMaps("ns").Get(context.Background(), DefaultName, metav1.GetOptions{})
		return err == nil && assert.ObjectsAreEqual(want, cm.Data)
	}, waitFor, tick)
	// The metric follows the write; wait for it rather than race it.
	require.Eventually(t, func() bool {
		return metricValue(t, reg, "trustbridge_distribution_writes_total", map[string]string{"result": resultUpdated}) == 1
	}, waitFor, tick)
	assert.Equal(t, 1.0, metricValue(t, reg, "trustbridge_distribution_writes_total", map[string]string{"result": resultConflict}))
}

func TestControllerWriteErrorRetried(t *testing.T) {
	verifyNoLeaks(t)
	store, _ := newStore(t)
	client := fake.NewClientset(namespace("ns", nil))
	var failures atomic.Int32
	client.PrependReactor("create", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failures.Add(1) <= 2 {
			return true, nil, apierrors.NewServiceUnavailable("etcd is having a bad day")
		}
		return false, nil, nil
	})
	var logs testlog.Buffer
	reg := prometheus.NewRegistry()
	c, err := New(Config{Client: client, Store: store, TrustDomain: spiffeid.RequireTrustDomainFromString(localTD),
		Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	startController(t, c)

	require.Eventually(t, func() bool {
		_, err := client.CoreV1().ConfigMaps("ns").Get(context.Background(), DefaultName, metav1.GetOptions{})
		return err == nil
	}, waitFor, tick)
	require.Eventually(t, func() bool {
		return metricValue(t, reg, "trustbridge_distribution_writes_total", map[string]string{"result": resultCreated}) == 1
	}, waitFor, tick)
	assert.Equal(t, 2.0, metricValue(t, reg, "trustbridge_distribution_writes_total", map[string]string{"result": resultError}))
	assert.Contains(t, logs.String(), "etcd is having a bad day")
}

// TestControllerRenderFailureKeepsLastGood: a snapshot that cannot be
// rendered leaves the distributed content as it was, with the failure in
// the logs and metrics, and the next good snapshot goes out.
func TestControllerRenderFailureKeepsLastGood(t *testing.T) {
	verifyNoLeaks(t)
	store, cas := newStore(t)
	client := fake.NewClientset(namespace("ns", nil))
	var logs testlog.Buffer
	reg := prometheus.NewRegistry()
	c, err := New(Config{Client: client, Store: store, TrustDomain: spiffeid.RequireTrustDomainFromString(localTD),
		Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	startController(t, c)

	ctx := context.Background()
	current := func() map[string]string {
		cm, err := client.CoreV1().ConfigMaps("ns").Get(ctx, DefaultName, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return cm.Data
	}
	good, _, err := render(store.Snapshot(), c.cfg.TrustDomain, maxConfigMapBytes)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return assert.ObjectsAreEqual(good, current()) }, waitFor, tick)

	// The local bundle disappears (and a peer arrives meanwhile): nothing
	// can be rendered without it.
	store.Remove("ca", cas[localTD].TrustDomain)
	store.Set("federation", testca.New(t, "b.example").Bundle())
	require.Eventually(t, func() bool {
		return metricValue(t, reg, "trustbridge_distribution_render_errors_total", nil) >= 1
	}, waitFor, tick)
	assert.Equal(t, good, current(), "last good content kept")
	assert.NoError(t, c.Ready(), "a later render failure does not make the controller unready")
	// The metric moves just before the log line is written.
	assert.Eventually(t, func() bool { return strings.Contains(logs.String(), "keeping the last good content") }, waitFor, tick, "logged")

	// A new local root comes back: it and the peer go out.
	next := testca.New(t, localTD)
	store.Set("ca", next.Bundle())
	require.Eventually(t, func() bool {
		data := current()
		return data != nil && data["b.example.pem"] != "" && len(parsePEM(t, data[KeyRootCert])) == 1 &&
			parsePEM(t, data[KeyRootCert])[0].Equal(next.Cert)
	}, waitFor, tick)
}

func TestControllerWaitsForLocalBundle(t *testing.T) {
	verifyNoLeaks(t)
	store := trust.NewStore()
	client := fake.NewClientset(namespace("ns", nil))
	c, err := New(Config{Client: client, Store: store, TrustDomain: spiffeid.RequireTrustDomainFromString(localTD)})
	require.NoError(t, err)
	startController(t, c)

	require.Eventually(t, func() bool {
		err := c.Ready()
		return err != nil && assert.ObjectsAreEqual(
			"distribution: nothing to distribute: the trust store holds no bundle for the local trust domain (\"local.example\")",
			err.Error())
	}, waitFor, tick)
	cms, err := client.CoreV1().ConfigMaps("ns").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, cms.Items, "nothing written before the local bundle exists")

	store.Set("ca", testca.New(t, localTD).Bundle())
	require.Eventually(t, func() bool { return c.Ready() == nil }, waitFor, tick)
	require.Eventually(t, func() bool {
		_, err := client.CoreV1().ConfigMaps("ns").Get(context.Background(), DefaultName, metav1.GetOptions{})
		return err == nil
	}, waitFor, tick)
}

func TestControllerRunTwice(t *testing.T) {
	verifyNoLeaks(t)
	store, _ := newStore(t)
	client := fake.NewClientset(namespace("ns", nil))
	c, err := New(Config{Client: client, Store: store, TrustDomain: spiffeid.RequireTrustDomainFromString(localTD)})
	require.NoError(t, err)

	stop := startController(t, c)
	require.Eventually(t, func() bool { return c.Ready() == nil }, waitFor, tick)
	require.EqualError(t, c.Run(context.Background()), "distribution: already running")
	stop()

	// A second term starts afresh and repairs what happened in between.
	require.NoError(t, client.CoreV1().ConfigMaps("ns").Delete(context.Background(), DefaultName, metav1.DeleteOptions{}))
	startController(t, c)
	require.Eventually(t, func() bool {
		_, err := client.CoreV1().ConfigMaps("ns").Get(context.Background(), DefaultName, metav1.GetOptions{})
		return err == nil
	}, waitFor, tick)
}

// TestReconcile checks each decision of one reconcile against the API
// calls it makes, from caches filled by hand.
func TestReconcile(t *testing.T) {
	store, _ := newStore(t)
	td := spiffeid.RequireTrustDomainFromString(localTD)
	want, _, err := render(store.Snapshot(), td, maxConfigMapBytes)
	require.NoError(t, err)
	stale := map[string]string{KeyRootCert: "stale"}
	immutable := func(cm *corev1.ConfigMap) *corev1.ConfigMap {
		cm.Immutable = new(bool)
		*cm.Immutable = true
		return cm
	}
	withBinary := func(cm *corev1.ConfigMap) *corev1.ConfigMap {
		cm.BinaryData = map[string][]byte{"extra": {1}}
		return cm
	}
	selected := map[string]string{"trust": "yes"}

	tests := []struct {
		name      string
		ns        *corev1.Namespace // nil: not in the cache
		cm        *corev1.ConfigMap // nil: not in the cache
		noContent bool
		want      []string // verbs of the API calls made
		wantData  map[string]string
	}{
		{name: "missing: create", ns: namespace("ns", selected), want: []string{"create"}, wantData: want},
		{name: "up to date: no write", ns: namespace("ns", selected), cm: configMap("ns", DefaultName, ours, want), wantData: want},
		{name: "stale: update", ns: namespace("ns", selected), cm: configMap("ns", DefaultName, ours, stale), want: []string{"update"}, wantData: want},
		{name: "extra binary data: update", ns: namespace("ns", selected), cm: withBinary(configMap("ns", DefaultName, ours, want)), want: []string{"update"}, wantData: want},
		{name: "foreign: left alone", ns: namespace("ns", selected), cm: configMap("ns", DefaultName, nil, stale), wantData: stale},
		{name: "foreign with another managed-by: left alone", ns: namespace("ns", selected), cm: configMap("ns", DefaultName, map[string]string{ManagedByLabel: "helm"}, stale), wantData: stale},
		{name: "immutable and stale: delete to recreate", ns: namespace("ns", selected), cm: immutable(configMap("ns", DefaultName, ours, stale)), want: []string{"delete"}},
		{name: "immutable and up to date: no write", ns: namespace("ns", selected), cm: immutable(configMap("ns", DefaultName, ours, want)), wantData: want},
		{name: "not selected, ours: delete", ns: namespace("ns", nil), cm: configMap("ns", DefaultName, ours, want), want: []string{"delete"}},
		{name: "namespace gone, ours: delete", cm: configMap("ns", DefaultName, ours, want), want: []string{"delete"}},
		{name: "not selected, foreign: left alone", ns: namespace("ns", nil), cm: configMap("ns", DefaultName, nil, stale), wantData: stale},
		{name: "not selected, none: nothing", ns: namespace("ns", nil)},
		{name: "nothing rendered yet: nothing", ns: namespace("ns", selected), noContent: true},
		{name: "nothing rendered yet, not selected, ours: still deleted", ns: namespace("ns", nil), cm: configMap("ns", DefaultName, ours, stale), noContent: true, want: []string{"delete"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var objs []runtime.Object
			nsIndexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			cmIndexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
			if tt.ns != nil {
				require.NoError(t, nsIndexer.Add(tt.ns))
				objs = append(objs, tt.ns)
			}
			if tt.cm != nil {
				require.NoError(t, cmIndexer.Add(tt.cm))
				objs = append(objs, tt.cm)
			}
			client := fake.NewClientset(objs...)
			c, err := New(Config{Client: client, Store: store, TrustDomain: td, NamespaceSelector: labels.SelectorFromSet(selected)})
			require.NoError(t, err)
			rs := &runState{nsLister: corelisters.NewNamespaceLister(nsIndexer), objects: cmIndexer,
				pacer: newPacer(defaultWriteBurst, defaultWriteEvery)}
			if !tt.noContent {
				rs.content.Store(&content{generation: store.Snapshot().Generation(), data: want})
			}
			client.ClearActions()

			require.NoError(t, c.reconcile(context.Background(), rs, "ns"))

			var verbs []string
			for _, a := range client.Actions() {
				verbs = append(verbs, a.GetVerb())
			}
			assert.Equal(t, tt.want, verbs)
			cm, err := client.CoreV1().ConfigMaps("ns").Get(context.Background(), DefaultName, metav1.GetOptions{})
			if tt.wantData == nil {
				assert.True(t, apierrors.IsNotFound(err), "want no ConfigMap, got %v", err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantData, cm.Data)
			if tt.cm == nil || tt.cm.Labels[ManagedByLabel] == ManagedByValue {
				assert.Equal(t, ManagedByValue, cm.Labels[ManagedByLabel])
				assert.Empty(t, cm.BinaryData)
			}
		})
	}
}

// TestControllerFailedWritesNotPaced: only writes that happen count
// against the pacer. Failed attempts, as while the API server is down,
// are spaced by the queue's backoff already and must not delay the write
// once it is back.
func TestControllerFailedWritesNotPaced(t *testing.T) {
	verifyNoLeaks(t)
	store, _ := newStore(t)
	client := fake.NewClientset(namespace("ns", nil))
	var failures atomic.Int32
	client.PrependReactor("create", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failures.Add(1) <= 4 {
			return true, nil, apierrors.NewServiceUnavailable("the API server is restarting")
		}
		return false, nil, nil
	})
	reg := prometheus.NewRegistry()
	c, err := New(Config{Client: client, Store: store, TrustDomain: spiffeid.RequireTrustDomainFromString(localTD), Registerer: reg})
	require.NoError(t, err)
	c.writeBurst, c.writeEvery = 2, time.Hour
	startController(t, c)

	require.Eventually(t, func() bool {
		_, err := client.CoreV1().ConfigMaps("ns").Get(context.Background(), DefaultName, metav1.GetOptions{})
		return err == nil
	}, waitFor, tick)
	assert.Equal(t, 0.0, metricValue(t, reg, "trustbridge_distribution_throttled_total", nil))
}
