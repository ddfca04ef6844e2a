package server

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trustbridge/trustbridge/ca/podcert"
)

// With an identity map, a pod certificate carries the identity the map
// gives the pod as the API server describes it, the node agents' rules;
// a pod the map gives none is denied (podcert.ErrNoIdentity).
func TestPodIdentityFromMap(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ids.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`
rules:
- name: pay-apps
  workloads:
  - namespace: pay
  spiffeID: "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/app/{{.PodLabels.app}}"
`), 0o600))
	o := Config{IdentityMap: IdentityMapConfig{File: path, Default: "none"}}
	idmap, err := setupIdentityMap(o, idmapTD, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	p := &serverParts{td: idmapTD, idmap: idmap}

	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "pay", Name: "api-1", UID: "u", Labels: map[string]string{"app": "checkout"}},
		Spec: corev1.PodSpec{NodeName: "n1", ServiceAccountName: "api"}}
	id, _, err := p.podIdentityFromMap(pod)
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/ns/pay/app/checkout", id.String())

	pod.Namespace = "shop"
	_, _, err = p.podIdentityFromMap(pod)
	assert.True(t, errors.Is(err, podcert.ErrNoIdentity), "no rule and default none: denied, not retried: %v", err)
}
