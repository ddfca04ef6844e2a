package kubetest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/trustbridge/trustbridge/internal/kube/crdcontroller"
)

// InstallCRD installs the CRD at path (once per API server: it outlives
// the tests) and returns a dynamic client.
func (e *Env) InstallCRD(t testing.TB, path string) dynamic.Interface {
	t.Helper()
	e.mu.Lock()
	err, done := e.crds[path]
	if !done {
		_, err = envtest.InstallCRDs(e.Config, envtest.CRDInstallOptions{Paths: []string{path}, ErrorIfPathMissing: true})
		if e.crds == nil {
			e.crds = map[string]error{}
		}
		e.crds[path] = err
	}
	e.mu.Unlock()
	require.NoError(t, err)
	dyn, err := dynamic.NewForConfig(e.Config)
	require.NoError(t, err)
	return dyn
}

// CreateYAML creates the resource doc holds, deleted when the test ends;
// an error is the API server's refusal.
func CreateYAML(t testing.TB, res dynamic.ResourceInterface, doc string) error {
	t.Helper()
	u := &unstructured.Unstructured{}
	require.NoError(t, yaml.Unmarshal([]byte(strings.TrimSpace(doc)), &u.Object))
	_, err := res.Create(context.Background(), u, metav1.CreateOptions{})
	if err == nil {
		t.Cleanup(func() { _ = res.Delete(context.Background(), u.GetName(), metav1.DeleteOptions{}) })
	}
	return err
}

// WaitReady waits for resource name's status to be about its current
// generation, with a Ready condition of reason, and returns the resource
// decoded into T.
func WaitReady[T any](t testing.TB, res dynamic.ResourceInterface, name, reason string) T {
	t.Helper()
	var cr T
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		u, err := res.Get(context.Background(), name, metav1.GetOptions{})
		require.NoError(c, err)
		require.NoError(c, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cr))
		var st struct {
			ObservedGeneration int64              `json:"observedGeneration"`
			Conditions         []metav1.Condition `json:"conditions"`
		}
		raw, _, _ := unstructured.NestedMap(u.Object, "status")
		require.NoError(c, runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &st))
		cond := meta.FindStatusCondition(st.Conditions, crdcontroller.ConditionReady)
		require.NotNil(c, cond)
		assert.Equal(c, reason, cond.Reason, cond.Message)
		assert.Equal(c, u.GetGeneration(), st.ObservedGeneration)
	}, 30*time.Second, 20*time.Millisecond)
	return cr
}

// FakeDynamic is a fake dynamic client serving gvr, whose lists are of
// kind listKind, holding objs.
func FakeDynamic(gvr schema.GroupVersionResource, listKind string, objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: listKind}, objs...)
}

// Lister lists Res, as an informer's lister would, so that a controller's
// sync sees what the previous one wrote.
type Lister struct {
	Res dynamic.ResourceInterface
}

// List lists everything: the selector is ignored.
func (l Lister) List(labels.Selector) ([]runtime.Object, error) {
	list, err := l.Res.List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]runtime.Object, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}
