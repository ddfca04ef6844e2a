package distribution

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// kubeRig is one controller on the shared API server. Tests run in
// parallel on one cluster, so each rig has its own selector label and its
// own ConfigMap name: controllers sharing a name would delete each other's
// ConfigMaps outside their selectors, which is why production runs one.
type kubeRig struct {
	env      *kubetest.Env
	client   kubernetes.Interface
	name     string
	labelKey string
	labelVal string
	store    *trust.Store
	cas      map[string]*testca.CA
	reg      *prometheus.Registry
	ctrl     *Controller
}

func newKubeRig(t *testing.T, client kubernetes.Interface, name string) *kubeRig {
	t.Helper()
	return newKubeRigWith(t, client, name, func(*Config) {})
}

// newKubeRigWith is newKubeRig with edit applied to the controller's
// Config.
func newKubeRigWith(t *testing.T, client kubernetes.Interface, name string, edit func(*Config)) *kubeRig {
	t.Helper()
	env := kubetest.Shared(t)
	if client == nil {
		client = env.Client
	}
	if name == "" {
		name = randomName("trust-")
	}
	store, cas := newStore(t)
	r := &kubeRig{
		env: env, client: client, name: name,
		labelKey: "distribution.trustbridge.test/selected", labelVal: randomName("t"),
		store: store, cas: cas, reg: prometheus.NewRegistry(),
	}
	cfg := Config{
		Client:            client,
		Store:             store,
		TrustDomain:       spiffeid.RequireTrustDomainFromString(localTD),
		Name:              name,
		NamespaceSelector: labels.SelectorFromSet(labels.Set{r.labelKey: r.labelVal}),
		Registerer:        r.reg,
	}
	edit(&cfg)
	c, err := New(cfg)
	require.NoError(t, err)
	r.ctrl = c
	return r
}

func (r *kubeRig) start(t *testing.T) {
	t.Helper()
	startController(t, r.ctrl)
	require.Eventually(t, func() bool { return r.ctrl.Ready() == nil }, waitFor, tick)
}

// namespace creates a namespace, selected or not.
func (r *kubeRig) namespace(t *testing.T, selected bool) string {
	t.Helper()
	ns := r.env.Namespace(t)
	if selected {
		r.setSelected(t, ns, true)
	}
	return ns
}

func (r *kubeRig) setSelected(t *testing.T, ns string, selected bool) {
	t.Helper()
	var value any // JSON null removes the label
	if selected {
		value = r.labelVal
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{r.labelKey: value}}})
	require.NoError(t, err)
	_, err = r.env.Client.CoreV1().Namespaces().Patch(context.Background(), ns, types.MergePatchType, patch, metav1.PatchOptions{})
	require.NoError(t, err)
}

func (r *kubeRig) get(ns string) (*corev1.ConfigMap, error) {
	return r.env.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), r.name, metav1.GetOptions{})
}

// want renders the store as it is now.
func (r *kubeRig) want(t *testing.T) map[string]string {
	t.Helper()
	data, _, err := render(r.store.Snapshot(), r.ctrl.cfg.TrustDomain, maxConfigMapBytes)
	require.NoError(t, err)
	return data
}

// waitCurrent waits until every namespace holds our ConfigMap with the
// store's current rendering.
func (r *kubeRig) waitCurrent(t *testing.T, namespaces ...string) {
	t.Helper()
	want := r.want(t)
	for _, ns := range namespaces {
		require.Eventually(t, func() bool {
			cm, err := r.get(ns)
			return err == nil && cm.Labels[ManagedByLabel] == ManagedByValue && assert.ObjectsAreEqual(want, cm.Data) && len(cm.BinaryData) == 0
		}, waitFor, tick, "namespace %s never got the current ConfigMap", ns)
	}
}

func (r *kubeRig) waitGone(t *testing.T, ns string) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := r.get(ns)
		return apierrors.IsNotFound(err)
	}, waitFor, tick, "ConfigMap in namespace %s never went away", ns)
}

func TestKubeSelection(t *testing.T) {
	t.Parallel()
	r := newKubeRig(t, nil, "")
	selected := r.namespace(t, true)
	unselected := r.namespace(t, false)
	r.start(t)

	r.waitCurrent(t, selected)
	_, err := r.get(unselected)
	assert.True(t, apierrors.IsNotFound(err), "unselected namespace has no ConfigMap: %v", err)

	t.Run("new namespace", func(t *testing.T) {
		r.waitCurrent(t, r.namespace(t, true))
	})
	t.Run("namespace relabelled to match", func(t *testing.T) {
		r.setSelected(t, unselected, true)
		r.waitCurrent(t, unselected)
	})
	t.Run("namespace relabelled to no longer match", func(t *testing.T) {
		r.setSelected(t, selected, false)
		r.waitGone(t, selected)
	})
	// Only the relabelled namespace is left: the new one's subtest has
	// deleted it (it stays Terminating, which does not count).
	require.Eventually(t, func() bool {
		return metricValue(t, r.reg, "trustbridge_distribution_namespaces", map[string]string{"state": stateCurrent}) == 1
	}, waitFor, tick)
}

func TestKubeRepair(t *testing.T) {
	t.Parallel()
	r := newKubeRig(t, nil, "")
	ns := r.namespace(t, true)
	r.start(t)
	r.waitCurrent(t, ns)
	cms := r.env.Client.CoreV1().ConfigMaps(ns)
	ctx := context.Background()

	edits := []struct {
		name string
		edit func(*corev1.ConfigMap)
	}{
		{name: "tampered root", edit: func(cm *corev1.ConfigMap) { cm.Data[KeyRootCert] = "-----BEGIN CERTIFICATE-----\nnot ours\n" }},
		{name: "key removed", edit: func(cm *corev1.ConfigMap) { delete(cm.Data, KeyBundleMap) }},
		{name: "key added", edit: func(cm *corev1.ConfigMap) { cm.Data["evil.example.pem"] = "x" }},
		{name: "binary data added", edit: func(cm *corev1.ConfigMap) { cm.BinaryData = map[string][]byte{"x": {0}} }},
		{name: "made immutable with other data", edit: func(cm *corev1.ConfigMap) {
			cm.Data[KeyRootCert] = "frozen"
			cm.Immutable = new(bool)
			*cm.Immutable = true
		}},
	}
	for _, e := range edits {
		t.Run(e.name, func(t *testing.T) {
			cm, err := r.get(ns)
			require.NoError(t, err)
			e.edit(cm)
			_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
			require.NoError(t, err)
			r.waitCurrent(t, ns)
		})
	}
	t.Run("deleted", func(t *testing.T) {
		cm, err := r.get(ns)
		require.NoError(t, err)
		require.NoError(t, cms.Delete(ctx, r.name, metav1.DeleteOptions{}))
		r.waitCurrent(t, ns)
		restored, err := r.get(ns)
		require.NoError(t, err)
		assert.NotEqual(t, cm.UID, restored.UID)
	})
	restored, err := r.get(ns)
	require.NoError(t, err)
	assert.Nil(t, restored.Immutable)
}

func TestKubeForeignConfigMap(t *testing.T) {
	t.Parallel()
	r := newKubeRig(t, nil, "")
	foreignSelected := r.namespace(t, true)
	foreignUnselected := r.namespace(t, false)
	selected := r.namespace(t, true)
	ctx := context.Background()
	var foreign []*corev1.ConfigMap
	for _, ns := range []string{foreignSelected, foreignUnselected} {
		cm, err := r.env.Client.CoreV1().ConfigMaps(ns).Create(ctx, configMap(ns, r.name,
			map[string]string{ManagedByLabel: "someone-else"}, map[string]string{"their": "data"}), metav1.CreateOptions{})
		require.NoError(t, err)
		foreign = append(foreign, cm)
	}
	r.start(t)

	r.waitCurrent(t, selected)
	require.Eventually(t, func() bool {
		return metricValue(t, r.reg, "trustbridge_distribution_foreign_configmaps_total", nil) >= 1
	}, waitFor, tick)
	assert.Equal(t, 1.0, metricValue(t, r.reg, "trustbridge_distribution_namespaces", map[string]string{"state": stateForeign}))
	for _, before := range foreign {
		after, err := r.get(before.Namespace)
		require.NoError(t, err)
		assert.Equal(t, before.ResourceVersion, after.ResourceVersion, "foreign ConfigMap in %s untouched", before.Namespace)
	}

	// The owner hands it over by labelling it ours: from then on it is
	// managed.
	cm, err := r.get(foreignSelected)
	require.NoError(t, err)
	cm.Labels[ManagedByLabel] = ManagedByValue
	_, err = r.env.Client.CoreV1().ConfigMaps(foreignSelected).Update(ctx, cm, metav1.UpdateOptions{})
	require.NoError(t, err)
	r.waitCurrent(t, foreignSelected)
}

func TestKubeTrustStoreChange(t *testing.T) {
	t.Parallel()
	r := newKubeRig(t, nil, "")
	namespaces := []string{r.namespace(t, true), r.namespace(t, true), r.namespace(t, true)}
	r.start(t)
	r.waitCurrent(t, namespaces...)

	t.Run("federated trust domain added", func(t *testing.T) {
		peer := testca.New(t, "peer.example")
		r.store.Set("federation", peer.Bundle())
		r.waitCurrent(t, namespaces...)
		for _, ns := range namespaces {
			cm, err := r.get(ns)
			require.NoError(t, err)
			assert.Equal(t, []string{peer.Cert.Subject.String()}, subjects(parsePEM(t, cm.Data["peer.example.pem"])))
			bundles, _, err := bundledoc.ParseMap([]byte(cm.Data[KeyBundleMap]))
			require.NoError(t, err)
			require.Len(t, bundles, 2)
			assert.Equal(t, "peer.example", bundles[1].TrustDomain().Name())
		}
	})
	t.Run("local roots rotated", func(t *testing.T) {
		old := r.cas[localTD]
		next := testca.New(t, localTD)
		r.store.Set("ca", bundleOf(localTD, old.Cert, next.Cert)) // prepared
		r.waitCurrent(t, namespaces...)
		r.store.Set("ca", next.Bundle()) // old root retired
		r.waitCurrent(t, namespaces...)
		for _, ns := range namespaces {
			cm, err := r.get(ns)
			require.NoError(t, err)
			roots := parsePEM(t, cm.Data[KeyRootCert])
			require.Len(t, roots, 1)
			assert.True(t, roots[0].Equal(next.Cert))
		}
	})
	t.Run("federated trust domain removed", func(t *testing.T) {
		r.store.Remove("federation", spiffeid.RequireTrustDomainFromString("peer.example"))
		r.waitCurrent(t, namespaces...)
		cm, err := r.get(namespaces[0])
		require.NoError(t, err)
		assert.NotContains(t, cm.Data, "peer.example.pem")
	})
	assert.Equal(t, 0.0, metricValue(t, r.reg, "trustbridge_distribution_writes_total", map[string]string{"result": resultError}))
}

// TestKubeTwoWritersPaced: two controllers that want different data in
// one ConfigMap (two installations sharing --root-configmap, a webhook
// rewriting the data) would undo each other's writes for ever at the API
// server's speed. Writes to one namespace are paced: after a burst, each
// further write waits, so the fight slows to a trickle, and it shows in a
// metric.
func TestKubeTwoWritersPaced(t *testing.T) {
	t.Parallel()
	const burst = 3
	a := newKubeRig(t, nil, "")
	ns := a.namespace(t, true)
	otherStore, _ := newStore(t)
	regB := prometheus.NewRegistry()
	b, err := New(Config{
		Client:            a.env.Client,
		Store:             otherStore,
		TrustDomain:       spiffeid.RequireTrustDomainFromString(localTD),
		Name:              a.name,
		NamespaceSelector: labels.SelectorFromSet(labels.Set{a.labelKey: a.labelVal}),
		Registerer:        regB,
	})
	require.NoError(t, err)
	for _, c := range []*Controller{a.ctrl, b} {
		c.writeBurst, c.writeEvery = burst, time.Hour
	}
	a.start(t)
	startController(t, b)

	regs := []*prometheus.Registry{a.reg, regB}
	writes := func() float64 {
		n := 0.0
		for _, reg := range regs {
			// Failed writes (conflicts, mostly) do not count against the
			// pacer; the writes that happened do.
			for _, r := range []string{resultCreated, resultUpdated, resultDeleted} {
				n += metricValue(t, reg, "trustbridge_distribution_writes_total", map[string]string{"result": r})
			}
		}
		return n
	}
	// The writer that wrote last sees its own data and stops; the other
	// one waits for the pacer.
	paced := assert.Eventually(t, func() bool {
		return metricValue(t, a.reg, "trustbridge_distribution_throttled_total", nil)+
			metricValue(t, regB, "trustbridge_distribution_throttled_total", nil) >= 1
	}, waitFor, tick, "the writers are paced")
	n := writes()
	require.True(t, paced, "%v writes", n)
	assert.LessOrEqual(t, n, float64(2*burst), "each writer wrote its burst and no more")
	_, err = a.get(ns)
	require.NoError(t, err)
}
