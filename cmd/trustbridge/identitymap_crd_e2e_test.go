package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/trustbridge/trustbridge/internal/authn/identitymap/mapcrd"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// The server's --identity-map-crd path against the real API server: a
// ClusterIdentityMapping joins the --identity-map file's rules in the
// server's map, its status is written by the leader (accepted, the
// conflict with the file's rule), /v1/snapshot and `trustbridge identity
// explain` show it, and deleting it takes it out.
func TestKubeIdentityMapCRD(t *testing.T) {
	env := kubetest.Shared(t)
	_, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join("..", "..", "deploy", "base", "identitymapping-crd.yaml")}, ErrorIfPathMissing: true,
	})
	require.NoError(t, err)
	dyn := servertest.DynamicClient(t, env)
	ns := env.Namespace(t)

	file := filepath.Join(t.TempDir(), "ids.yaml")
	require.NoError(t, os.WriteFile(file, []byte(`rules:
- name: file-pay-api
  workloads:
  - namespace: pay-`+ns+`
    serviceAccount: api
  spiffeID: "spiffe://{{.TrustDomain}}/pay/{{.ServiceAccount}}"
`), 0o600))
	o := baseServerOptions("example.org", t.TempDir())
	o.GRPC = server.GRPCConfig{Listen: "127.0.0.1:0", TokenReview: server.TokenReviewOff,
		Kubeconfig: servertest.WriteKubeconfig(t, env.Config.Host, env)}
	o.Kube = fastKubeStorage(ns)
	o.Kube.IdentityMapCRD = true
	o.IdentityMap = server.IdentityMapConfig{File: file}
	admin, _, _ := launchServer(t, o)

	res := dyn.Resource(mapcrd.GVR)
	name := "pay-apps-" + ns
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": mapcrd.Group + "/" + mapcrd.Version, "kind": mapcrd.Kind,
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"workloads": []any{map[string]any{"namespace": "pay-" + ns}},
			"spiffeID":  "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/app/{{.PodLabels.app}}",
		},
	}}
	_, err = res.Create(context.Background(), u, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = res.Delete(context.Background(), name, metav1.DeleteOptions{}) })

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got, err := res.Get(context.Background(), name, metav1.GetOptions{})
		require.NoError(c, err)
		var cr mapcrd.ClusterIdentityMapping
		require.NoError(c, runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &cr))
		cond := meta.FindStatusCondition(cr.Status.Conditions, mapcrd.ConditionReady)
		require.NotNil(c, cond, "no Ready condition: %+v", cr.Status)
		assert.Equal(c, mapcrd.ReasonAccepted, cond.Reason, "%+v", cond)
		if assert.Len(c, cr.Status.Conflicts, 1) {
			assert.Contains(c, cr.Status.Conflicts[0], `rule "file-pay-api"`)
		}
	}, 30*time.Second, 50*time.Millisecond)

	code, body := servertest.Get(t, "http://"+admin+"/v1/snapshot")
	require.Equal(t, 200, code, body)
	var snap api.Snapshot
	require.NoError(t, json.Unmarshal([]byte(body), &snap))
	require.NotNil(t, snap.IdentityMap)
	var rules []string
	for _, r := range snap.IdentityMap.Rules {
		rules = append(rules, r.Name+"="+r.Origin)
	}
	assert.ElementsMatch(t, []string{name + "=crd:" + name, "file-pay-api=file:" + file + ":2"}, rules)
	assert.Len(t, snap.IdentityMap.Conflicts, 1)

	out, stderr, code := runCLI(t, "", "identity", "explain", "--admin", "http://"+admin,
		"--namespace", "pay-"+ns, "--service-account", "web", "--label", "app=checkout")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "identity: spiffe://example.org/ns/pay-"+ns+"/app/checkout")

	require.NoError(t, res.Delete(context.Background(), name, metav1.DeleteOptions{}))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, body := servertest.Get(t, "http://"+admin+"/v1/snapshot")
		var snap api.Snapshot
		require.NoError(c, json.Unmarshal([]byte(body), &snap))
		require.NotNil(c, snap.IdentityMap)
		assert.Len(c, snap.IdentityMap.Rules, 1)
	}, 30*time.Second, 50*time.Millisecond)
}
