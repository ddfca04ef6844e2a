package main

import (
	"context"
	"crypto"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
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

func (m *memKeys) DestroyKey(context.Context, string) error { return nil }

// TestCACommandsRefuseKeyManagerState: ca issue and ca rotate cannot open
// the key manager, and must not put a key in the state beside it.
func TestCACommandsRefuseKeyManagerState(t *testing.T) {
	dataDir := t.TempDir()
	_, err := ca.New(ca.Config{TrustDomain: spiffeid.RequireTrustDomainFromString("example.org"), DataDir: dataDir, Keys: &memKeys{keys: map[string]crypto.Signer{}}})
	require.NoError(t, err)
	_, stderr, code := runCLIAt(t, time.Now, "", "ca", "issue", "--data-dir", dataDir, "--spiffe-id", "spiffe://example.org/demo", "--credentials-dir", t.TempDir(), "--ttl", "1h")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "the CA's keys are in a key manager (--key-manager); use trustbridge ca request against the running server")
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "rotate", "--data-dir", dataDir)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "key manager")
}
