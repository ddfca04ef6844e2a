package server

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
)

var idmapTD = spiffeid.RequireTrustDomainFromString("example.org")

// Without --identity-map or --identity-map-crd there is no map: the node
// authorizer gets a nil source (not a typed nil) and grants the Istio form
// only, as before identity maps.
func TestSetupIdentityMapNone(t *testing.T) {
	s, err := setupIdentityMap(Config{}, idmapTD, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	assert.Nil(t, s)
	assert.Nil(t, s.source())
	assert.Nil(t, s.ready())
	assert.Empty(t, s.runners())
	assert.Nil(t, s.adminConfig())
}

func TestSetupIdentityMapFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ids.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`
rules:
- name: pay-apps
  workloads:
  - namespace: pay
  spiffeID: "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/app/{{.PodLabels.app}}"
`), 0o600))
	o := Config{IdentityMap: IdentityMapConfig{File: path, Default: "none"}}
	s, err := setupIdentityMap(o, idmapTD, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	require.NotNil(t, s.source())
	m := s.source().Load()
	require.NotNil(t, m)
	assert.Equal(t, identitymap.DefaultNone, m.Default())
	ident, err := m.Identify(identitymap.ServerFacts("pay", "api", "api-1", "u", "n", map[string]string{"app": "checkout"}))
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/ns/pay/app/checkout", ident.ID.String())
	assert.Nil(t, s.ready(), "no resources to wait for")
	assert.Len(t, s.runners(), 1, "the file's poller")
	assert.NotNil(t, s.adminConfig())

	// A bad file at start stops the server, naming the flag.
	require.NoError(t, os.WriteFile(path, []byte("rules:\n- name: x\n  spiffeID: spiffe://{{.TrustDomain}}/x\n"), 0o600))
	_, err = setupIdentityMap(o, idmapTD, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	assert.ErrorContains(t, err, "--identity-map: ")
	o.IdentityMap.Default = "maybe"
	_, err = setupIdentityMap(o, idmapTD, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	assert.ErrorContains(t, err, "--identity-map-default")
}

func TestIdentityMapCRDNeedsKubeStorage(t *testing.T) {
	o := Config{Kube: KubeConfig{IdentityMapCRD: true, Storage: StorageFile}}
	assert.ErrorIs(t, checkStorageFlags(o), errIdentityMapCRDStorage)
	o.Kube.Storage = StorageKube
	assert.NoError(t, checkStorageFlags(o))
}
