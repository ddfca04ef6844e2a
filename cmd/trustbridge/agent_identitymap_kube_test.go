package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/trustbridge/trustbridge/internal/agent"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap/mapcrd"
	"github.com/trustbridge/trustbridge/internal/pemfile"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/sds"
)

// A node agent with --identity-map-crd maps its workloads with the
// ClusterIdentityMapping resources of the API server, as the server does:
// this process, a host process by its uid, gets the ID a resource gives
// it, with no --identity-map file.
func TestAgentNodeIdentityMapCRD(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	env := kubetest.Shared(t)
	_, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join("..", "..", "deploy", "base", "identitymapping-crd.yaml")}, ErrorIfPathMissing: true,
	})
	require.NoError(t, err)
	app := servertest.LaptopID.String() + "/from-crd"
	addr, rootCert, _ := grpcServerWithTokens(t, servertest.LaptopToken+","+servertest.LaptopID.String()+",reusable\n", func(o *server.Config) {
		o.GRPC.NodeAgents = []string{servertest.LaptopID.String() + "=" + app}
	})
	rootsPEM, err := os.ReadFile(rootCert)
	require.NoError(t, err)

	dyn, err := dynamic.NewForConfig(env.Config)
	require.NoError(t, err)
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": mapcrd.Group + "/" + mapcrd.Version, "kind": mapcrd.Kind,
		"metadata": map[string]any{"name": "agent-e2e-this-process"},
		"spec": map[string]any{
			"workloads": []any{map[string]any{"uid": int64(os.Getuid())}},
			"spiffeID":  app,
		},
	}}
	_, err = dyn.Resource(mapcrd.GVR).Create(context.Background(), u, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dyn.Resource(mapcrd.GVR).Delete(context.Background(), u.GetName(), metav1.DeleteOptions{}) })

	o := agentFor(t, addr, rootsPEM, servertest.LaptopToken)
	o.Node = agent.NodeConfig{Enabled: true, Name: "vm-1", IdentityDefault: "none", IdentityMapCRD: true,
		Kubeconfig: servertest.WriteKubeconfig(t, env.Config.Host, env)}
	o.WorkloadSocket = ""
	startAgent(t, o)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		resp, err := sdsFetch(t, o.Socket, sds.DefaultName)
		require.NoError(c, err)
		require.Len(c, resp.GetResources(), 1)
		var s tlsv3.Secret
		require.NoError(c, resp.GetResources()[0].UnmarshalTo(&s))
		chain, err := pemfile.ParseCertificates(s.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
		require.NoError(c, err)
		require.Len(c, chain[0].URIs, 1)
		assert.Equal(c, app, chain[0].URIs[0].String())
	}, 60*time.Second, 100*time.Millisecond, fmt.Sprintf("the agent serves %s from the resource", app))
}
