package server

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/trustbridge/trustbridge/federation/crd"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// A server with --federation-crd federates with a trust domain as soon as
// its ClusterFederatedTrustDomain is created, reports the poll in the
// resource's status, and stops trusting it when the resource is deleted:
// no restart at any point.
func TestKubeFederationCRD(t *testing.T) {
	env := kubetest.Shared(t)
	servertest.InstallCRD(t, env)
	dyn := servertest.DynamicClient(t, env)
	ns := env.Namespace(t)

	eastData, eastRoots := bootstrapDataDir(t, "east.example")
	east := startE2EServer(t, "east.example", eastData, nil)

	o := baseServerOptions("west.example", t.TempDir())
	o.Federation.MinRefresh = time.Second
	o.Federation.AllowPrivate = true
	o.GRPC.Kubeconfig = servertest.WriteKubeconfig(t, env.Config.Host, env)
	o.Kube = fastKubeStorage(ns)
	o.Kube.FederationCRD, o.Kube.FederationClass = true, "crd-e2e"
	admin, _, _ := launchServer(t, o)
	west := &e2eServer{admin: "http://" + admin}
	_, ok := federationStatus(t, west, "east.example")
	require.False(t, ok)

	doc, err := bundledoc.Marshal(servertest.SPIFFEBundle(t, "east.example", eastRoots...))
	require.NoError(t, err)
	name := "east-example-e2e"
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": crd.Group + "/" + crd.Version, "kind": crd.Kind,
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"trustDomain": "east.example", "bundleEndpointURL": east.bundleURL, "className": "crd-e2e",
			"bundleEndpointProfile": map[string]any{"type": "https_spiffe", "endpointSPIFFEID": "spiffe://east.example/trustbridge/bundle-endpoint"},
			"trustDomainBundle":     string(doc),
		},
	}}
	res := dyn.Resource(crd.GVR)
	_, err = res.Create(context.Background(), u, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = res.Delete(context.Background(), name, metav1.DeleteOptions{}) })

	st := waitFederated(t, west, "east.example", 1, 30*time.Second)
	var cr crd.ClusterFederatedTrustDomain
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got, err := res.Get(context.Background(), name, metav1.GetOptions{})
		require.NoError(c, err)
		cr = crd.ClusterFederatedTrustDomain{}
		require.NoError(c, runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &cr))
		assert.True(c, meta.IsStatusConditionTrue(cr.Status.Conditions, crd.ConditionReady), "status never Ready: %+v", cr.Status)
	}, 30*time.Second, 100*time.Millisecond)
	assert.Equal(t, "ok", cr.Status.State)
	require.NotNil(t, cr.Status.Sequence, "%+v", cr.Status)
	assert.Equal(t, int64(*st.Sequence), *cr.Status.Sequence)
	var roots []crd.Authority
	for _, a := range cr.Status.Authorities {
		if a.Kind == "x509" {
			roots = append(roots, a)
		}
	}
	require.Len(t, roots, 1, "east's root (and its JWT key)")
	assert.Equal(t, servertest.SHA256Hex(eastRoots[0].Raw), roots[0].SHA256)

	// The snapshot names the resource as the relationship's origin.
	view, ok := viewOf(servertest.GetSnapshot(t, west.admin), "east.example")
	require.True(t, ok)
	assert.Equal(t, "crd:"+name, view.Federation.Origin)

	require.NoError(t, res.Delete(context.Background(), name, metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		_, ok := federationStatus(t, west, "east.example")
		return !ok
	}, 30*time.Second, 100*time.Millisecond, "east.example still federated after its resource was deleted")
	_, ok = viewOf(servertest.GetSnapshot(t, west.admin), "east.example")
	assert.False(t, ok, "no longer trusted")
}
