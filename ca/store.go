package ca

import (
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/fileutil"
)

// Layout of the CA's part of --data-dir. state.json is the commit point:
// key and certificate files are written first, each atomically, and only
// then the journal that names them. A file the journal does not name is
// left over from an interrupted write and is never trusted.
const (
	stateDirName  = "ca"
	journalName   = "state.json"
	rootsDirName  = "roots"
	lockName      = ".lock"
	journalFormat = 1
	maxJournal    = 1 << 20
)

// Store reads and writes CA state under a data directory.
type Store struct {
	dir string // <data-dir>/ca
	// saveErr, set by tests, makes saveJournal fail as a full disk would.
	saveErr error
}

// NewStore returns a store for dataDir. It touches nothing on disk.
func NewStore(dataDir string) *Store {
	return &Store{dir: filepath.Join(dataDir, stateDirName)}
}

// Dir is the CA state directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) journalPath() string       { return filepath.Join(s.dir, journalName) }
func (s *Store) certPath(id string) string { return filepath.Join(s.dir, rootsDirName, id+".crt.pem") }
func (s *Store) keyPath(id string) string  { return filepath.Join(s.dir, rootsDirName, id+".key.pem") }
func (s *Store) lockPath() string          { return filepath.Join(s.dir, lockName) }

// jwtKeyPath is where JWT key kid's private key lives: beside the root
// keys, so the directory checks, leftover detection and backups that
// cover them cover it too.
func (s *Store) jwtKeyPath(kid string) string {
	return filepath.Join(s.dir, rootsDirName, castate.JWTKeyKey(kid))
}
func (s *Store) wrap(err error) error { return fmt.Errorf("ca: state in %s: %w", s.dir, err) }

// ensureDirs creates the state directory (0700) and refuses one another
// user could write to: they could plant a root key the CA would sign with.
func (s *Store) ensureDirs() error {
	if err := fileutil.EnsureDir(s.dir); err != nil {
		return err
	}
	// roots/ holds the keys themselves: a writable one would let another
	// user plant one even under a tight state directory.
	return fileutil.EnsureDir(filepath.Join(s.dir, rootsDirName))
}

func corrupt(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{castate.ErrCorruptState}, a...)...)
}
func fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

// Load reads the journal and every root it names, checking that it
// belongs to trust domain td (any, when td is empty). It returns (nil,
// nil, nil) for a fresh directory. A directory holding root files but no
// journal, a journal that does not parse, or a root whose files are
// missing or do not match the journal is refused with ErrCorruptState.
//
// JWT keys the journal names are loaded and checked the same way;
// LoadWithJWTKeys returns them.
func (s *Store) Load(td string) (*castate.Journal, []*castate.Root, error) {
	j, roots, _, _, err := s.load(td)
	return j, roots, err
}

// LoadWithJWTKeys is Load, with the JWT signing keys the journal names.
func (s *Store) LoadWithJWTKeys(td string) (*castate.Journal, []*castate.Root, []*castate.JWTKey, error) {
	j, roots, keys, _, err := s.load(td)
	return j, roots, keys, err
}

// load is Load, with the JWT keys and the version (digest) of the journal
// it read.
func (s *Store) load(td string) (*castate.Journal, []*castate.Root, []*castate.JWTKey, string, error) {
	for _, dir := range []string{s.dir, filepath.Join(s.dir, rootsDirName)} {
		if err := fileutil.CheckDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, nil, nil, "", s.wrap(err)
		}
	}
	data, err := readCapped(s.journalPath(), maxJournal)
	if errors.Is(err, fs.ErrNotExist) {
		if leftovers := s.rootFiles(); len(leftovers) > 0 {
			return nil, nil, nil, "", s.wrap(corrupt("%s is missing but root files exist (%s); refusing to start over and orphan them",
				journalName, strings.Join(leftovers, ", ")))
		}
		return nil, nil, nil, "", nil
	}
	if err != nil {
		return nil, nil, nil, "", s.wrap(err)
	}
	j, err := castate.DecodeJournal(data, td)
	if err != nil {
		return nil, nil, nil, "", s.wrap(err)
	}
	roots := make([]*castate.Root, 0, len(j.Roots))
	for _, rec := range j.Roots {
		r, err := s.loadRoot(rec)
		if err != nil {
			return nil, nil, nil, "", s.wrap(err)
		}
		roots = append(roots, r)
	}
	keys := make([]*castate.JWTKey, 0, len(j.JWTKeys))
	for _, rec := range j.JWTKeys {
		k, err := s.loadJWTKey(rec)
		if err != nil {
			return nil, nil, nil, "", s.wrap(err)
		}
		keys = append(keys, k)
	}
	return j, roots, keys, journalVersion(data), nil
}

// readCapped reads a regular file, refusing one larger than limit before
// reading it all.
func readCapped(path string, limit int64) ([]byte, error) {
	data, _, err := fileutil.Read(path, limit)
	if errors.Is(err, fileutil.ErrTooLarge) || errors.Is(err, fileutil.ErrNotRegular) {
		return nil, corrupt("%s is %v", filepath.Base(path), err)
	}
	return data, err
}

func (s *Store) rootFiles() []string {
	entries, err := os.ReadDir(filepath.Join(s.dir, rootsDirName))
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func (s *Store) loadRoot(rec castate.RootRecord) (*castate.Root, error) {
	certPEM, err := os.ReadFile(s.certPath(rec.ID))
	if err != nil {
		return nil, corrupt("root %s: %v", rec.ID, err)
	}
	var keyPEM []byte
	if rec.KeyRef == "" {
		keyPEM, err = readPrivateKeyFile(s.keyPath(rec.ID), "root "+rec.ID)
		if err != nil {
			return nil, err
		}
	}
	r, err := castate.DecodeRoot(rec, certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%w (files in %s)", err, filepath.Join(s.dir, rootsDirName))
	}
	return r, nil
}

func (s *Store) loadJWTKey(rec castate.JWTKeyRecord) (*castate.JWTKey, error) {
	if rec.KeyRef != "" {
		return castate.DecodeJWTKey(rec, nil)
	}
	keyPEM, err := readPrivateKeyFile(s.jwtKeyPath(rec.KID), "JWT key "+rec.KID)
	if err != nil {
		return nil, err
	}
	k, err := castate.DecodeJWTKey(rec, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%w (file %s)", err, s.jwtKeyPath(rec.KID))
	}
	return k, nil
}

// readPrivateKeyFile reads a key file the journal names, refusing one
// group or others could read, and one missing (ErrCorruptState).
func readPrivateKeyFile(path, what string) ([]byte, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, corrupt("%s: %v", what, err)
	}
	if info.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s: private key %s is mode %04o; it must not be readable by group or others (chmod 600)", what, path, info.Mode().Perm())
	}
	data, err := readCapped(path, maxKeyFile)
	if errors.Is(err, castate.ErrCorruptState) {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err != nil {
		return nil, corrupt("%s: %v", what, err)
	}
	return data, nil
}

// maxKeyFile bounds a private key file: an RSA-4096 PKCS#8 PEM is about
// 3.3 KiB.
const maxKeyFile = 64 << 10

// writeJWTKeyOnce writes k's private key (0600) unless its file exists.
// It must be followed by saveJournal of a journal naming the key; until then the
// file is a leftover.
func (s *Store) writeJWTKeyOnce(k *castate.JWTKey) error {
	if k.KeyRef != "" || fileExists(s.jwtKeyPath(k.KID)) {
		return nil
	}
	if err := s.ensureDirs(); err != nil {
		return s.wrap(err)
	}
	keyPEM, err := castate.EncodeJWTKey(k)
	if err != nil {
		return s.wrap(err)
	}
	if err := fileutil.Write(s.jwtKeyPath(k.KID), keyPEM, 0o600); err != nil {
		return s.wrap(err)
	}
	return nil
}

// writeRoot writes a new root's key (0600) and certificate. It must be
// followed by saveJournal of a journal naming the root; until then the files are
// leftovers. A nil key writes only the certificate: the root's key is in
// a key manager (RootRecord.KeyRef).
func (s *Store) writeRoot(cert *x509.Certificate, key crypto.Signer) (string, error) {
	if err := s.ensureDirs(); err != nil {
		return "", s.wrap(err)
	}
	id := cert.SerialNumber.Text(16)
	if key != nil {
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return "", s.wrap(err)
		}
		if err := fileutil.Write(s.keyPath(id), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			return "", s.wrap(err)
		}
	}
	if err := fileutil.Write(s.certPath(id), pemCert(cert), 0o644); err != nil {
		return "", s.wrap(err)
	}
	return id, nil
}

// removeRootFiles deletes a root's files after a journal without it was
// saved.
func (s *Store) removeRootFiles(id string) error {
	for _, p := range []string{s.keyPath(id), s.certPath(id)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return s.wrap(err)
		}
	}
	return nil
}

// saveJournal writes the journal atomically.
func (s *Store) saveJournal(j *castate.Journal) error {
	_, err := s.save(j)
	return err
}

// save is saveJournal, returning the bytes written.
func (s *Store) save(j *castate.Journal) ([]byte, error) {
	if s.saveErr != nil {
		return nil, s.wrap(s.saveErr)
	}
	if err := s.ensureDirs(); err != nil {
		return nil, s.wrap(err)
	}
	data, err := castate.EncodeJournal(j)
	if err != nil {
		return nil, s.wrap(err)
	}
	if err := fileutil.Write(s.journalPath(), data, 0o600); err != nil {
		return nil, s.wrap(err)
	}
	return data, nil
}

// HasState says whether the directory holds a journal, the CA state a
// server started before (whether or not it loads).
func (s *Store) HasState() (bool, error) {
	_, err := os.Lstat(s.journalPath())
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, s.wrap(err)
	}
	return true, nil
}

// Blank says whether the state directory holds nothing but what a start
// that was cut short leaves before its first root: it is missing, or
// holds only the lock file and an empty roots/.
func (s *Store) Blank() (bool, error) {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, s.wrap(err)
	}
	for _, e := range entries {
		switch {
		case e.Name() == lockName && e.Type().IsRegular():
		case e.Name() == rootsDirName && e.IsDir():
			roots, err := os.ReadDir(filepath.Join(s.dir, rootsDirName))
			if err != nil {
				return false, s.wrap(err)
			}
			if len(roots) > 0 {
				return false, nil
			}
		default:
			return false, nil
		}
	}
	return true, nil
}

func publicKeysMatch(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}

func pemCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}
