package main

import (
	"context"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/trustbridge/trustbridge/federation/crd"
	"github.com/trustbridge/trustbridge/federation/kubelkg"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// With --storage kube, federation add creates a ClusterFederatedTrustDomain
// (of the server's class) that the controller applies, and federation
// remove deletes it, and with it east's stored bundle; without
// --federation-crd both are refused, saying what to do.
func TestKubeFederationAddCreatesResource(t *testing.T) {
	env := kubetest.Shared(t)
	servertest.InstallCRD(t, env)
	dyn := servertest.DynamicClient(t, env)

	eastData, _ := bootstrapDataDir(t, "east.example")
	east := startE2EServer(t, "east.example", eastData, nil)
	eastPEM := writeTemp(t, mustCLI(t, "bundle", "show", "-o", "pem", "--data-dir", eastData))

	var ns string // the last server's namespace
	kubeServer := func(federationCRD bool) (*e2eServer, string) {
		dir := t.TempDir()
		ns = env.Namespace(t)
		o := baseServerOptions("west.example", dir)
		o.Federation.MinRefresh = time.Second
		o.Federation.AllowPrivate = true
		o.GRPC.Kubeconfig = servertest.WriteKubeconfig(t, env.Config.Host, env)
		o.Kube = fastKubeStorage(ns)
		o.Kube.FederationCRD, o.Kube.FederationClass = federationCRD, "manage-e2e"
		admin, _, _ := launchServer(t, o)
		return &e2eServer{admin: "http://" + admin}, dir
	}
	add := func(s *e2eServer, dir string) (string, string, int) {
		return runCLIAt(t, time.Now, "", "federation", "add", "east.example", east.bundleURL,
			"--endpoint-spiffe-id", "spiffe://east.example/trustbridge/bundle-endpoint", "--bundle", eastPEM, "--admin", s.admin, "--data-dir", dir)
	}

	t.Run("without --federation-crd", func(t *testing.T) {
		s, dir := kubeServer(false)
		_, stderr, code := add(s, dir)
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr, "restart it with --federation-crd")
		_, stderr, code = runCLIAt(t, time.Now, "", "federation", "update", "east.example", "--endpoint-url", east.bundleURL, "--admin", s.admin, "--data-dir", dir)
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr, "restart it with --federation-crd")
	})

	west, dir := kubeServer(true)
	stdout, stderr, code := add(west, dir)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "federated with east.example")
	t.Cleanup(func() { _ = dyn.Resource(crd.GVR).Delete(context.Background(), "east.example", metav1.DeleteOptions{}) })

	got, err := dyn.Resource(crd.GVR).Get(context.Background(), "east.example", metav1.GetOptions{})
	require.NoError(t, err)
	var cr crd.ClusterFederatedTrustDomain
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &cr))
	assert.Equal(t, "manage-e2e", cr.Spec.ClassName)
	assert.Equal(t, east.bundleURL, cr.Spec.BundleEndpointURL)
	assert.NotEmpty(t, cr.Spec.TrustDomainBundle)

	waitFederated(t, west, "east.example", 1, 30*time.Second)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, "crd:east.example", relationships(t, west)["east.example"].Origin)
	}, 30*time.Second, 100*time.Millisecond)

	lkg, err := kubelkg.New(kubelkg.Config{Client: env.Client, Namespace: ns})
	require.NoError(t, err)
	eastTD := spiffeid.RequireTrustDomainFromString("east.example")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		e, err := lkg.Load(eastTD)
		assert.NoError(c, err)
		assert.NotNil(c, e, "the leader stored east's bundle")
	}, 30*time.Second, 100*time.Millisecond)

	// federation update edits the resource; bundle delete has no
	// resource form.
	moved := "https://" + servertest.ReservePort(t) + "/"
	stdout, stderr, code = runCLIAt(t, time.Now, "", "federation", "update", "east.example", "--endpoint-url", moved, "--no-fetch", "--admin", west.admin, "--data-dir", dir)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "updated east.example")
	got, err = dyn.Resource(crd.GVR).Get(context.Background(), "east.example", metav1.GetOptions{})
	require.NoError(t, err)
	var updated crd.ClusterFederatedTrustDomain
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &updated))
	assert.Equal(t, moved, updated.Spec.BundleEndpointURL)
	assert.Equal(t, cr.Spec.BundleEndpointProfile, updated.Spec.BundleEndpointProfile, "the profile kept")
	assert.Equal(t, "manage-e2e", updated.Spec.ClassName)
	_, stderr, code = runCLIAt(t, time.Now, "", "bundle", "delete", "east.example", "--admin", west.admin, "--data-dir", dir)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "with --storage kube a bundle set with bundle set is the trustDomainBundle of a ClusterFederatedTrustDomain")

	stdout, stderr, code = runCLIAt(t, time.Now, "", "federation", "remove", "east.example", "--admin", west.admin, "--data-dir", dir)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "removed east.example")
	require.Eventually(t, func() bool {
		_, ok := federationStatus(t, west, "east.example")
		return !ok
	}, 30*time.Second, 100*time.Millisecond, "east.example still federated after federation remove")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		e, err := lkg.Load(eastTD)
		assert.NoError(c, err)
		assert.Nil(c, e, "removing the resource deletes east's stored bundle: adding it again starts from its new bundle")
	}, 30*time.Second, 100*time.Millisecond)
}
