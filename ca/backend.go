package ca

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/trustbridge/trustbridge/ca/castate"
)

// checkCommit refuses to persist a journal whose roots and JWT keys are
// not exactly the ones given with material.
func checkCommit(j *castate.Journal, roots []*castate.Root, jwtKeys []*castate.JWTKey) error {
	if err := checkJWTCommit(j, jwtKeys); err != nil {
		return err
	}
	if len(j.Roots) != len(roots) {
		return fmt.Errorf("journal names %d roots, %d given", len(j.Roots), len(roots))
	}
	for i, rec := range j.Roots {
		if roots[i].ID != rec.ID {
			return fmt.Errorf("journal root %d is %s, material is for %s", i, rec.ID, roots[i].ID)
		}
		if !castate.SafeID(rec.ID) {
			return fmt.Errorf("unsafe root id %q", rec.ID)
		}
	}
	return nil
}

// fileBackend is the Backend of the data directory: Store, with the
// journal's digest as version.
type fileBackend struct{ s *Store }

func (b fileBackend) Load(td string) (*castate.Journal, []*castate.Root, []*castate.JWTKey, string, error) {
	return b.s.load(td)
}
func (b fileBackend) Lock(exclusive bool) (func(), error) { return b.s.Lock(exclusive) }
func (b fileBackend) Describe() string                    { return b.s.journalPath() }

func (b fileBackend) Version() (string, error) {
	data, err := readCapped(b.s.journalPath(), maxJournal)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", b.s.wrap(err)
	}
	return journalVersion(data), nil
}

func journalVersion(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Commit writes the key and certificate files of roots and JWT keys not
// yet on disk, each atomically, then the journal, the commit point; then
// it removes files of roots and keys the journal no longer names and
// temporary files a crash left (they may hold a key copy). The caller
// holds the exclusive lock, so a version other than base means a writer
// that does not take it.
func (b fileBackend) Commit(base string, j *castate.Journal, roots []*castate.Root, jwtKeys []*castate.JWTKey) (string, error) {
	s := b.s
	if err := checkCommit(j, roots, jwtKeys); err != nil {
		return "", s.wrap(err)
	}
	cur, err := b.Version()
	if err != nil {
		return "", err
	}
	if cur != base {
		return "", s.wrap(fmt.Errorf("%w: %s changed since it was read", castate.ErrConflict, journalName))
	}
	keep, err := s.writeMissingMaterial(roots, jwtKeys)
	if err != nil {
		return "", err
	}
	data, err := s.save(j)
	if err != nil {
		return "", err
	}
	s.pruneRootFiles(keep)
	return journalVersion(data), nil
}

// writeMissingMaterial writes the files of roots and JWT keys not yet on
// disk, before the journal that names them, so a committed journal never
// names missing material. It returns the file stems (root IDs, JWT key
// stems) to keep when pruning.
func (s *Store) writeMissingMaterial(roots []*castate.Root, jwtKeys []*castate.JWTKey) (map[string]bool, error) {
	keep := map[string]bool{}
	for _, r := range roots {
		keep[r.ID] = true
		if fileExists(s.certPath(r.ID)) && (r.KeyRef != "" || fileExists(s.keyPath(r.ID))) {
			continue
		}
		key, err := storedRootKey(r)
		if err != nil {
			return nil, s.wrap(err)
		}
		id, err := s.writeRoot(r.Cert, key)
		if err != nil {
			return nil, err
		}
		if id != r.ID {
			return nil, s.wrap(fmt.Errorf("root %s: certificate serial names it %s", r.ID, id))
		}
	}
	for _, k := range jwtKeys {
		keep[strings.TrimSuffix(castate.JWTKeyKey(k.KID), ".key.pem")] = true
		if err := s.writeJWTKeyOnce(k); err != nil {
			return nil, err
		}
	}
	return keep, nil
}

// pruneRootFiles removes, after the journal was saved, the files of
// roots and keys whose stem is not in keep and the temporary files a
// crash left (they may hold a key copy). Failures are ignored: the
// journal is already committed, and the next commit tries again.
func (s *Store) pruneRootFiles(keep map[string]bool) {
	for _, name := range s.rootFiles() {
		if strings.HasPrefix(name, ".") && strings.Contains(name, ".tmp-") {
			_ = os.Remove(filepath.Join(s.Dir(), rootsDirName, name))
			continue
		}
		if id := trimRootSuffix(name); id != "" && !keep[id] {
			_ = s.removeRootFiles(id)
		}
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func trimRootSuffix(name string) string {
	for _, suf := range []string{".crt.pem", ".key.pem"} {
		if len(name) > len(suf) && strings.HasSuffix(name, suf) {
			return name[:len(name)-len(suf)]
		}
	}
	return ""
}
