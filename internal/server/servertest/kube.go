package servertest

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// DynamicClient is a dynamic Kubernetes client of env.
func DynamicClient(t testing.TB, env *kubetest.Env) dynamic.Interface {
	t.Helper()
	dyn, err := dynamic.NewForConfig(env.Config)
	require.NoError(t, err)
	return dyn
}

// InstallCRD installs deploy/base/crd.yaml into env; the path is relative
// to a test two directories below the repository root (cmd/trustbridge,
// internal/server).
func InstallCRD(t testing.TB, env *kubetest.Env) {
	t.Helper()
	_, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join("..", "..", "deploy", "base", "crd.yaml")}, ErrorIfPathMissing: true,
	})
	require.NoError(t, err)
}
