package kubestore

import (
	"context"
	"crypto"
	"fmt"
	"sync"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// memKeys is an in-memory ca.KeyManager.
type memKeys struct {
	mu   sync.Mutex
	keys map[string]crypto.Signer
}

func (m *memKeys) CreateKey(_ context.Context, kt ca.KeyType, _ string) (crypto.Signer, string, error) {
	k, err := ca.GenerateKey(kt)
	if err != nil {
		return nil, "", err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	ref := fmt.Sprintf("ref-%d", len(m.keys)+1)
	m.keys[ref] = k
	return k, ref, nil
}

func (m *memKeys) FindKey(_ context.Context, ref string) (crypto.Signer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if k, ok := m.keys[ref]; ok {
		return k, nil
	}
	return nil, ca.ErrKeyNotFound
}

func (m *memKeys) DestroyKey(_ context.Context, ref string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.keys, ref)
	return nil
}

// TestKeyRefEncodeDecode: a root and JWT key whose keys are in a key
// manager go into the Secret without a private key, and come back with
// their KeyRef and no key; a missing key is still refused without one.
func TestKeyRefEncodeDecode(t *testing.T) {
	dir := t.TempDir()
	cfg := authorityConfig(clocktesting.NewFakeClock(t0), nil, nil)
	cfg.Backend, cfg.DataDir, cfg.Keys = nil, dir, &memKeys{keys: map[string]crypto.Signer{}}
	_, err := ca.New(cfg)
	require.NoError(t, err)
	j, roots, jwtKeys, err := ca.NewStore(dir).LoadWithJWTKeys("example.org")
	require.NoError(t, err)
	require.NotEmpty(t, roots[0].KeyRef)

	data, err := encode(j, roots, jwtKeys)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{castate.JournalKey, castate.RootCertKey(roots[0].ID)}, sortedKeys(data), "no private keys in the Secret")
	st, err := decode(&corev1.Secret{Data: data}, "example.org")
	require.NoError(t, err)
	require.Len(t, st.roots, 1)
	assert.Equal(t, roots[0].KeyRef, st.roots[0].KeyRef)
	assert.Nil(t, st.roots[0].Key)
	require.Len(t, st.jwtKeys, 1)
	assert.Equal(t, jwtKeys[0].KeyRef, st.jwtKeys[0].KeyRef)

	j.Roots[0].KeyRef = ""
	data, err = encode(j, roots, jwtKeys)
	require.NoError(t, err)
	_, err = decode(&corev1.Secret{Data: data}, "example.org")
	require.ErrorIs(t, err, castate.ErrCorruptState, "a root without KeyRef needs its key")
}

// TestKeyRefSecretRestart: an Authority on a Secret with a key manager
// restarts with the same keys.
func TestKeyRefSecretRestart(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	clk := clocktesting.NewFakeClock(t0)
	keys := &memKeys{keys: map[string]crypto.Signer{}}
	cfg := authorityConfig(clk, newStore(t, env.Client, ns, nil), nil)
	cfg.Keys = keys
	a, err := ca.New(cfg)
	require.NoError(t, err)
	sec := secret(t, env.Client, ns)
	assert.ElementsMatch(t, []string{castate.JournalKey, castate.RootCertKey(a.Roots()[0].ID)}, sortedKeys(sec.Data))

	cfg2 := authorityConfig(clk, newStore(t, env.Client, ns, nil), nil)
	cfg2.Keys = keys
	b, err := ca.New(cfg2)
	require.NoError(t, err)
	assert.Equal(t, a.Roots()[0].ID, b.Roots()[0].ID)
	id := spiffeid.RequireFromPath(td, "/w")
	_, err = b.SignX509SVID(ca.X509SVIDParams{PublicKey: workloadCSR(t, id).PublicKey, SPIFFEID: id})
	require.NoError(t, err)
	_, _, err = b.SignJWT(id, []string{"aud"}, 0)
	require.NoError(t, err)
}
