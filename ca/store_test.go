package ca

import (
	"crypto/x509"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca/castate"
)

var tdExample = spiffeid.RequireTrustDomainFromString("example.org")

// storeWithRoot writes one active root and a journal naming it.
func storeWithRoot(t *testing.T) (*Store, *castate.Journal, string) {
	t.Helper()
	dir := t.TempDir()
	s := NewStore(dir)
	cert, key, err := newRootCert(tdExample, KeyECP256, t0, 24*time.Hour, false)
	require.NoError(t, err)
	id, err := s.writeRoot(cert, key)
	require.NoError(t, err)
	j := &castate.Journal{TrustDomain: "example.org", Sequence: 1, Roots: []castate.RootRecord{{ID: id, State: castate.StateActive, CertSHA256: fingerprint(cert), PreparedAt: t0}}}
	require.NoError(t, s.saveJournal(j))
	return s, j, id
}

func TestStoreRoundTrip(t *testing.T) {
	s, _, id := storeWithRoot(t)
	j, roots, err := s.Load("example.org")
	require.NoError(t, err)
	require.Len(t, roots, 1)
	assert.Equal(t, id, roots[0].ID)
	assert.Equal(t, uint64(1), j.Sequence)
	assert.True(t, publicKeysMatch(roots[0].Key.Public(), roots[0].Cert.PublicKey))

	info, err := os.Stat(s.keyPath(id))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "private keys are 0600")
	info, err = os.Stat(s.journalPath())
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	info, err = os.Stat(s.Dir())
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), info.Mode().Perm())
}

func TestStoreFresh(t *testing.T) {
	j, roots, err := NewStore(t.TempDir()).Load("example.org")
	require.NoError(t, err)
	assert.Nil(t, j)
	assert.Nil(t, roots)
}

func TestStoreRefusesCorruptState(t *testing.T) {
	tests := []struct {
		name   string
		break_ func(t *testing.T, s *Store, j *castate.Journal, id string)
		want   string
	}{
		{"truncated journal", func(t *testing.T, s *Store, _ *castate.Journal, _ string) {
			data, err := os.ReadFile(s.journalPath())
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(s.journalPath(), data[:len(data)/2], 0o600))
		}, "state.json does not parse"},
		{"journal missing, root files present", func(t *testing.T, s *Store, _ *castate.Journal, _ string) {
			require.NoError(t, os.Remove(s.journalPath()))
		}, "state.json is missing but root files exist"},
		{"unknown field", func(t *testing.T, s *Store, _ *castate.Journal, _ string) {
			writeJSON(t, s.journalPath(), map[string]any{"format": 1, "trust_domain": "example.org", "surprise": true})
		}, `unknown field "surprise"`},
		{"other trust domain", func(t *testing.T, s *Store, j *castate.Journal, _ string) {
			j.TrustDomain = "other.org"
			require.NoError(t, s.saveJournal(j))
		}, `it holds the CA of trust domain "other.org", not "example.org"`},
		{"future format", func(t *testing.T, s *Store, j *castate.Journal, _ string) {
			writeJSON(t, s.journalPath(), map[string]any{"format": 2, "trust_domain": "example.org"})
		}, "format 2"},
		{"key file missing", func(t *testing.T, s *Store, _ *castate.Journal, id string) {
			require.NoError(t, os.Remove(s.keyPath(id)))
		}, "no such file"},
		{"certificate swapped", func(t *testing.T, s *Store, _ *castate.Journal, id string) {
			other, _, err := newRootCert(tdExample, KeyECP256, t0, time.Hour, false)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(s.certPath(id), certsToPEM(other), 0o644))
		}, "does not match the fingerprint"},
		{"key swapped", func(t *testing.T, s *Store, _ *castate.Journal, id string) {
			_, otherKey, err := newRootCert(tdExample, KeyECP256, t0, time.Hour, false)
			require.NoError(t, err)
			s2 := NewStore(t.TempDir())
			otherCert, _, err := newRootCert(tdExample, KeyECP256, t0, time.Hour, false)
			require.NoError(t, err)
			oid, err := s2.writeRoot(otherCert, otherKey)
			require.NoError(t, err)
			data, err := os.ReadFile(s2.keyPath(oid))
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(s.keyPath(id), data, 0o600))
		}, "private key does not match the certificate"},
		{"key readable by others", func(t *testing.T, s *Store, _ *castate.Journal, id string) {
			require.NoError(t, os.Chmod(s.keyPath(id), 0o644))
		}, "must not be readable by group or others"},
		{"two active roots", func(t *testing.T, s *Store, j *castate.Journal, _ string) {
			cert, key, err := newRootCert(tdExample, KeyECP256, t0, time.Hour, false)
			require.NoError(t, err)
			id2, err := s.writeRoot(cert, key)
			require.NoError(t, err)
			j.Roots = append(j.Roots, castate.RootRecord{ID: id2, State: castate.StateActive, CertSHA256: fingerprint(cert)})
			require.NoError(t, s.saveJournal(j))
		}, "2 active roots"},
		{"path in id", func(t *testing.T, s *Store, j *castate.Journal, _ string) {
			j.Roots[0].ID = "../../etc/passwd"
			require.NoError(t, s.saveJournal(j))
		}, "unsafe or duplicate id"},
		{"unknown state", func(t *testing.T, s *Store, j *castate.Journal, _ string) {
			j.Roots[0].State = "zombie"
			require.NoError(t, s.saveJournal(j))
		}, `unknown state "zombie"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, j, id := storeWithRoot(t)
			tt.break_(t, s, j, id)
			before := snapshotDir(t, s.Dir())
			_, _, err := s.Load("example.org")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Equal(t, before, snapshotDir(t, s.Dir()), "a refused state directory is left as it was")
		})
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := json.Marshal(v)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, data, 0o600))
}

func certsToPEM(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pemCert(c)...)
	}
	return out
}

// snapshotDir maps every file under dir to its content.
func snapshotDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		out[p] = string(data)
		return err
	}))
	return out
}

// Blank tells the skeleton a first start leaves before its first root
// (the lock file, an empty roots/) from state; HasState looks for the
// journal only.
func TestStoreBlankAndHasState(t *testing.T) {
	dataDir := t.TempDir()
	s := NewStore(dataDir)
	check := func(wantBlank, wantState bool) {
		t.Helper()
		blank, err := s.Blank()
		require.NoError(t, err)
		assert.Equal(t, wantBlank, blank, "Blank")
		has, err := s.HasState()
		require.NoError(t, err)
		assert.Equal(t, wantState, has, "HasState")
	}
	check(true, false) // no ca/ at all
	unlock, err := s.Lock(true)
	require.NoError(t, err)
	unlock()
	check(true, false) // ca/.lock and an empty ca/roots/

	require.NoError(t, os.WriteFile(filepath.Join(s.Dir(), "roots", "x.key.pem"), nil, 0o600))
	check(false, false) // a root file without a journal
	require.NoError(t, os.Remove(filepath.Join(s.Dir(), "roots", "x.key.pem")))
	require.NoError(t, os.WriteFile(filepath.Join(s.Dir(), "stray"), nil, 0o600))
	check(false, false)
	require.NoError(t, os.Remove(filepath.Join(s.Dir(), "stray")))

	require.NoError(t, os.WriteFile(filepath.Join(s.Dir(), castate.JournalKey), []byte("{"), 0o600))
	check(false, true) // a journal, even one that does not load
}
