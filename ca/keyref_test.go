package ca

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca/castate"
)

// fakeKeys is an in-memory KeyManager. Two fakes sharing keys are one
// token seen by two processes.
type fakeKeys struct {
	*fakeToken
	createErr, findErr, destroyErr error
}

type fakeToken struct {
	mu        sync.Mutex
	keys      map[string]crypto.Signer
	labels    map[string]string
	destroyed []string
	finds     int
	next      int
}

func newFakeKeys() *fakeKeys {
	return &fakeKeys{fakeToken: &fakeToken{keys: map[string]crypto.Signer{}, labels: map[string]string{}}}
}

// restart is the same token opened by a new process.
func (f *fakeKeys) restart() *fakeKeys { return &fakeKeys{fakeToken: f.fakeToken} }

func (f *fakeKeys) String() string { return "fake token" }

func (f *fakeKeys) CreateKey(_ context.Context, kt KeyType, label string) (crypto.Signer, string, error) {
	if f.createErr != nil {
		return nil, "", f.createErr
	}
	k, err := GenerateKey(kt)
	if err != nil {
		return nil, "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	ref := fmt.Sprintf("ref-%d", f.next)
	f.keys[ref], f.labels[ref] = k, label
	return k, ref, nil
}

func (f *fakeKeys) FindKey(_ context.Context, ref string) (crypto.Signer, error) {
	if f.findErr != nil {
		return nil, f.findErr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.finds++
	k, ok := f.keys[ref]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrKeyNotFound, ref)
	}
	return k, nil
}

func (f *fakeKeys) DestroyKey(_ context.Context, ref string) error {
	if f.destroyErr != nil {
		return f.destroyErr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.keys, ref)
	f.destroyed = append(f.destroyed, ref)
	return nil
}

func (f *fakeKeys) has(ref string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.keys[ref]
	return ok
}

func keysConfig(t *testing.T, clk *clocktesting.FakeClock, keys KeyManager) Config {
	cfg := testConfig(t, clk)
	cfg.Keys = keys
	return cfg
}

func TestKeyManagerBootstrapSignRestart(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	fk := newFakeKeys()
	cfg := keysConfig(t, clk, fk)
	a, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, a.Ready())
	assert.Equal(t, "fake token", a.KeyStorage())

	j, _, err := NewStore(cfg.DataDir).Load("")
	require.NoError(t, err)
	require.Len(t, j.Roots, 1)
	require.Len(t, j.JWTKeys, 1)
	rootRef, jwtRef := j.Roots[0].KeyRef, j.JWTKeys[0].KeyRef
	require.NotEmpty(t, rootRef)
	require.NotEmpty(t, jwtRef)
	assert.True(t, j.UsesKeyManager())
	assert.Equal(t, "trustbridge example.org root "+j.Roots[0].ID, fk.labels[rootRef])
	assert.True(t, strings.HasPrefix(fk.labels[jwtRef], "trustbridge example.org jwt "))
	files, err := os.ReadDir(filepath.Join(cfg.DataDir, stateDirName, rootsDirName))
	require.NoError(t, err)
	for _, f := range files {
		assert.False(t, strings.HasSuffix(f.Name(), ".key.pem"), "no private key in the state: %s", f.Name())
	}
	data, err := os.ReadFile(filepath.Join(cfg.DataDir, stateDirName, journalName))
	require.NoError(t, err)
	assert.Contains(t, string(data), `"key_ref": "`+rootRef+`"`)

	id := spiffeid.RequireFromPath(tdExample, "/w")
	res, err := a.Sign(workloadCSR(t, id), id, 0)
	require.NoError(t, err)
	assert.True(t, publicKeysMatch(fk.keys[rootRef].Public(), a.Roots()[0].Cert.PublicKey))
	_, _, err = a.SignJWT(id, []string{"aud"}, 0)
	require.NoError(t, err)

	// A new process on the same token finds the same keys, once each.
	cfg2 := cfg
	cfg2.Registerer = nil
	fk2 := fk.restart()
	cfg2.Keys = fk2
	b, err := New(cfg2)
	require.NoError(t, err)
	assert.Equal(t, 2, fk.finds, "one FindKey per key")
	require.NoError(t, b.Reload())
	clk.Step(time.Minute)
	require.NoError(t, b.Reconcile())
	assert.Equal(t, 2, fk.finds, "reloads use the cache")
	res2, err := b.Sign(workloadCSR(t, id), id, 0)
	require.NoError(t, err)
	assert.Equal(t, res.Leaf.Issuer.String(), res2.Leaf.Issuer.String(), "the same root signs after the restart")
	assert.Equal(t, jwtRef, b.manager.jwtKeys[0].KeyRef)
}

func TestKeyManagerRotationDestroysRemovedKeys(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	fk := newFakeKeys()
	a, err := New(keysConfig(t, clk, fk))
	require.NoError(t, err)
	require.NoError(t, a.Rotate())
	require.NoError(t, a.manager.rotateJWTKey())
	require.Len(t, a.Roots(), 2)
	for _, r := range a.manager.roots {
		require.NotEmpty(t, r.KeyRef)
	}
	first := a.manager.roots[0].KeyRef
	for now := t0; now.Before(t0.Add(3 * 24 * time.Hour)); now = now.Add(5 * time.Minute) {
		clk.SetTime(now)
		require.NoError(t, a.Reconcile())
	}
	require.NotEmpty(t, fk.destroyed, "removed roots' keys are destroyed")
	assert.Contains(t, fk.destroyed, first)
	for _, r := range a.manager.roots {
		assert.True(t, fk.has(r.KeyRef), "a published root keeps its key")
		assert.NotContains(t, fk.destroyed, r.KeyRef)
	}
	for _, k := range a.manager.jwtKeys {
		assert.True(t, fk.has(k.KeyRef), "a published JWT key keeps its key")
	}
	id := spiffeid.RequireFromPath(tdExample, "/w")
	_, err = a.Sign(workloadCSR(t, id), id, 0)
	require.NoError(t, err)
	_, _, err = a.SignJWT(id, []string{"aud"}, 0)
	require.NoError(t, err)
}

func TestKeyManagerDestroyFailureIsCountedAndRetried(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	fk := newFakeKeys()
	a, err := New(keysConfig(t, clk, fk))
	require.NoError(t, err)
	require.NoError(t, a.Rotate())
	fk.destroyErr = errors.New("token is read-only")
	first := a.manager.roots[0].KeyRef
	now := t0
	for ; len(a.Roots()) == 2 || a.manager.roots[0].KeyRef == first; now = now.Add(5 * time.Minute) {
		clk.SetTime(now)
		require.NoError(t, a.Reconcile(), "a destroy failure is not fatal")
		require.True(t, now.Before(t0.Add(3*24*time.Hour)), "root never removed")
	}
	assert.True(t, fk.has(first))
	assert.Positive(t, testutil.ToFloat64(a.metrics.keyManagerErrors.WithLabelValues("destroy")))
	fk.destroyErr = nil
	require.NoError(t, a.Rotate())
	assert.False(t, fk.has(first), "tried again after the next commit")
}

func TestKeyRefStateWithoutKeyManagerRefused(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := keysConfig(t, clk, newFakeKeys())
	_, err := New(cfg)
	require.NoError(t, err)
	cfg.Keys, cfg.Registerer = nil, nil
	_, err = New(cfg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "'s key is in a key manager (ref ref-1); start with --key-manager pkcs11 and the same token")
}

func TestKeyManagerCreateFailureKeepsState(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	fk := newFakeKeys()
	cfg := keysConfig(t, clk, fk)
	a, err := New(cfg)
	require.NoError(t, err)
	journal := filepath.Join(cfg.DataDir, stateDirName, journalName)
	before, err := os.ReadFile(journal)
	require.NoError(t, err)
	fk.createErr = errors.New("token full")
	err = a.Rotate()
	require.ErrorContains(t, err, "token full")
	require.ErrorContains(t, err, "in fake token")
	assert.Len(t, a.Roots(), 1, "the previous state is kept")
	after, err := os.ReadFile(journal)
	require.NoError(t, err)
	assert.Equal(t, before, after, "no journal written")
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.keyManagerErrors.WithLabelValues("create")))

	// The scheduled check reports it through Ready.
	a.manager.recordCheck(a.Rotate(), "CA rotation check failed")
	require.ErrorContains(t, a.Ready(), "token full")
	fk.createErr = nil
	require.NoError(t, a.Rotate())
	a.manager.recordCheck(nil, "")
	require.NoError(t, a.Ready())
	assert.Len(t, a.Roots(), 2)
}

func TestKeyManagerJWTCreateFailureKeepsState(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	fk := newFakeKeys()
	a, err := New(keysConfig(t, clk, fk))
	require.NoError(t, err)
	fk.createErr = errors.New("token full")
	require.ErrorContains(t, a.manager.rotateJWTKey(), "token full")
	assert.Len(t, a.JWTKeys(), 1)
}

func TestKeyManagerFindFailureAtNew(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	fk := newFakeKeys()
	cfg := keysConfig(t, clk, fk)
	_, err := New(cfg)
	require.NoError(t, err)

	fk2 := fk.restart()
	fk2.findErr = errors.New("PIN incorrect")
	cfg.Keys, cfg.Registerer = fk2, nil
	_, err = New(cfg)
	require.ErrorContains(t, err, "PIN incorrect")
	require.ErrorContains(t, err, "find its key (ref ref-1) in fake token")

	// A key deleted from the token by hand.
	fk3 := fk.restart()
	fk3.keys = map[string]crypto.Signer{}
	cfg.Keys = fk3
	_, err = New(cfg)
	require.ErrorIs(t, err, ErrKeyNotFound)
}

func TestKeyManagerMismatchedKeyRefused(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	fk := newFakeKeys()
	cfg := keysConfig(t, clk, fk)
	_, err := New(cfg)
	require.NoError(t, err)
	other, err := GenerateKey(KeyECP256)
	require.NoError(t, err)
	fk.keys["ref-1"] = other // the root's ref now finds another key
	cfg.Keys, cfg.Registerer = fk.restart(), nil
	_, err = New(cfg)
	require.ErrorIs(t, err, castate.ErrCorruptState)
}

func TestDecodeKeyRefRecords(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := keysConfig(t, clk, newFakeKeys())
	a, err := New(cfg)
	require.NoError(t, err)
	r := a.manager.roots[0]
	certPEM, keyPEM, err := castate.EncodeRoot(r)
	require.NoError(t, err)
	assert.Nil(t, keyPEM, "no key in the state for a KeyRef root")
	got, err := castate.DecodeRoot(r.RootRecord, certPEM, nil)
	require.NoError(t, err)
	assert.Nil(t, got.Key, "resolved by the Authority")
	_, err = castate.DecodeRoot(r.RootRecord, certPEM, []byte("-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n"))
	require.ErrorIs(t, err, castate.ErrCorruptState, "a KeyRef root with a key in the state is refused")
	plain := r.RootRecord
	plain.KeyRef = ""
	_, err = castate.DecodeRoot(plain, certPEM, nil)
	require.ErrorIs(t, err, castate.ErrCorruptState, "a root without KeyRef still needs its key")

	k := a.manager.jwtKeys[0]
	kp, err := castate.EncodeJWTKey(k)
	require.NoError(t, err)
	assert.Nil(t, kp)
	gotK, err := castate.DecodeJWTKey(k.JWTKeyRecord, nil)
	require.NoError(t, err)
	assert.Nil(t, gotK.Key)
	plainK := k.JWTKeyRecord
	plainK.KeyRef = ""
	_, err = castate.DecodeJWTKey(plainK, nil)
	require.ErrorIs(t, err, castate.ErrCorruptState)
}

func TestJWTKeyManagerTypes(t *testing.T) {
	for jt, want := range map[JWTKeyType]KeyType{JWTKeyES256: KeyECP256, JWTKeyES384: KeyECP384, JWTKeyRS256: KeyRSA3072} {
		got, err := jwtKeyManagerType(jt)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	_, err := jwtKeyManagerType("HS256")
	require.Error(t, err)
}

func TestKeyStorageWithoutManager(t *testing.T) {
	a, err := New(testConfig(t, clocktesting.NewFakeClock(t0)))
	require.NoError(t, err)
	assert.Equal(t, "state", a.KeyStorage())
	assert.Empty(t, a.manager.roots[0].KeyRef)
}

func TestRequestRotationRefusedWithKeyManager(t *testing.T) {
	cfg := keysConfig(t, clocktesting.NewFakeClock(t0), newFakeKeys())
	_, err := New(cfg)
	require.NoError(t, err)
	journal := filepath.Join(cfg.DataDir, stateDirName, journalName)
	before, err := os.ReadFile(journal)
	require.NoError(t, err)
	_, _, err = RequestRotation(cfg.DataDir, t0)
	require.ErrorContains(t, err, "key manager")
	_, _, err = RequestJWTRotation(cfg.DataDir, t0)
	require.ErrorContains(t, err, "key manager")
	after, err := os.ReadFile(journal)
	require.NoError(t, err)
	assert.Equal(t, before, after, "nothing written")
}

func TestRequireHSMNeedsKeys(t *testing.T) {
	cfg := testConfig(t, clocktesting.NewFakeClock(t0))
	cfg.RequireHSM = true
	_, err := New(cfg)
	require.ErrorContains(t, err, "key manager")
	cfg.Keys = newFakeKeys()
	a, err := New(cfg)
	require.NoError(t, err)
	assert.True(t, a.RequireHSM())
}

func TestSnapshotOfKeyRefStateHoldsNoKeys(t *testing.T) {
	cfg := keysConfig(t, clocktesting.NewFakeClock(t0), newFakeKeys())
	a, err := New(cfg)
	require.NoError(t, err)
	j, files, err := Snapshot(cfg.DataDir)
	require.NoError(t, err)
	assert.True(t, j.UsesKeyManager())
	var names []string
	for _, f := range files {
		names = append(names, f.Name)
	}
	assert.Equal(t, []string{"ca/state.json", "ca/roots/" + castate.RootCertKey(a.Roots()[0].ID)}, names, "a backup holds references, no private keys")
}

func TestKeyManagerRefusedInPluginMode(t *testing.T) {
	cfg := keysConfig(t, clocktesting.NewFakeClock(t0), newFakeKeys())
	cfg.Plugin = NewPluginWatcher(t.TempDir(), tdExample, clocktesting.NewFakeClock(t0), time.Second, nil)
	_, err := New(cfg)
	require.ErrorContains(t, err, "plug-in mode")
}
