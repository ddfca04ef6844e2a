package server

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"k8s.io/client-go/dynamic"

	"github.com/trustbridge/trustbridge/ca/kubestore"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/kube/leader"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// federatedSequences returns the trust domains /v1/federation reports,
// and, into seqs when not nil, their sequence numbers (0 for none).
func federatedSequences(t *testing.T, admin string, seqs *[]uint64) []string {
	t.Helper()
	code, body := get(t, "http://"+admin+"/v1/federation")
	require.Equal(t, http.StatusOK, code, body)
	var status []federation.Status
	require.NoError(t, json.Unmarshal([]byte(body), &status))
	var tds []string
	for _, s := range status {
		tds = append(tds, s.TrustDomain)
		if seqs != nil {
			var n uint64
			if s.Sequence != nil {
				n = *s.Sequence
			}
			*seqs = append(*seqs, n)
		}
	}
	return tds
}

func trustOf(t *testing.T, admin string) trustDoc {
	t.Helper()
	code, body := get(t, "http://"+admin+"/v1/trust")
	require.Equal(t, 200, code, body)
	var doc trustDoc
	require.NoError(t, json.Unmarshal([]byte(body), &doc))
	return doc
}

func installCRD(t *testing.T, env *kubetest.Env) {
	t.Helper()
	_, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join("..", "..", "deploy", "base", "crd.yaml")}, ErrorIfPathMissing: true,
	})
	require.NoError(t, err)
}

func dynamicClient(t *testing.T, env *kubetest.Env) dynamic.Interface {
	t.Helper()
	dyn, err := dynamic.NewForConfig(env.Config)
	require.NoError(t, err)
	return dyn
}

// fastKubeStorage is --storage kube in namespace ns with the default CA
// Secret and leader Lease and leader election timings short enough for
// tests.
func fastKubeStorage(ns string) KubeConfig {
	return KubeConfig{
		Storage: StorageKube, Namespace: ns, CASecret: kubestore.DefaultName, LeaderLease: leader.DefaultName,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 250 * time.Millisecond,
	}
}
