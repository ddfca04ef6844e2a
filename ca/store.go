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
	"time"

	"github.com/trustbridge/trustbridge/internal/atomicfile"
	"github.com/trustbridge/trustbridge/internal/cappedfile"
	"github.com/trustbridge/trustbridge/internal/securedir"
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

// ErrCorruptState marks a state directory trustbridge refuses to use. It is
// never overwritten: an operator must look at it.
var ErrCorruptState = errors.New("corrupt CA state")

// Journal is the persisted CA state: which roots exist, in which state,
// and the sequence number of the published bundle.
type Journal struct {
	Format      int    `json:"format"`
	TrustDomain string `json:"trust_domain"`
	Sequence    uint64 `json:"sequence"`
	// MaxWorkloadTTLSeconds is the longest leaf TTL ever allowed with
	// these roots. It only grows: a retired root stays published until
	// every leaf it could have signed has expired, and `ca issue` in
	// another process must not sign beyond what the server allows.
	MaxWorkloadTTLSeconds int64 `json:"max_workload_ttl_seconds"`
	// Settings of the serving process, so that `ca rotate` and `ca issue`
	// in another process follow them instead of their own defaults.
	Settings *JournalSettings `json:"settings,omitempty"`
	Roots    []RootRecord     `json:"roots"`
	// MaxJWTSVIDTTLSeconds is the longest JWT-SVID TTL ever allowed with
	// these JWT keys; like MaxWorkloadTTLSeconds it only grows, and a
	// retired JWT key stays published that long.
	MaxJWTSVIDTTLSeconds int64 `json:"max_jwt_svid_ttl_seconds,omitempty"`
	// JWTKeys are the JWT-SVID signing keys. State written before they
	// existed has none; the next leader's check bootstraps one.
	JWTKeys []JWTKeyRecord `json:"jwt_keys,omitempty"`
	// PluginRoots are the roots published in plug-in mode: those of the
	// directory, and earlier ones kept until the leaves they signed expire.
	PluginRoots []PluginRootRecord `json:"plugin_roots,omitempty"`
	Updated     time.Time          `json:"updated"`
	Events      []JournalNote      `json:"events,omitempty"`
}

// clone deep-copies the journal.
func (j *Journal) clone() *Journal {
	c := *j
	c.Roots = append([]RootRecord(nil), j.Roots...)
	c.JWTKeys = append([]JWTKeyRecord(nil), j.JWTKeys...)
	c.Events = append([]JournalNote(nil), j.Events...)
	c.PluginRoots = append([]PluginRootRecord(nil), j.PluginRoots...)
	if j.Settings != nil {
		st := *j.Settings
		c.Settings = &st
	}
	return &c
}

// PluginRootRecord is a root published in plug-in mode. A root that left
// the directory has RemoveAfter set.
type PluginRootRecord struct {
	SHA256      string    `json:"sha256"`
	DER         []byte    `json:"der"`
	RemoveAfter time.Time `json:"remove_after,omitzero"`
}

// JournalSettings are the serving process's CA settings.
type JournalSettings struct {
	KeyType                   KeyType `json:"key_type"`
	RootTTLSeconds            int64   `json:"root_ttl_seconds"`
	RefreshHintSeconds        int64   `json:"refresh_hint_seconds"`
	CurrentMaxWorkloadSeconds int64   `json:"current_max_workload_ttl_seconds"`
	// JWT key settings, for `ca rotate --jwt`; absent in state written
	// before JWT keys existed.
	JWTKeyType               JWTKeyType `json:"jwt_key_type,omitempty"`
	JWTKeyTTLSeconds         int64      `json:"jwt_key_ttl_seconds,omitempty"`
	CurrentMaxJWTSVIDSeconds int64      `json:"current_max_jwt_svid_ttl_seconds,omitempty"`
	// SignsIntermediates: roots leave room for downstream intermediates
	// (Config.SignsIntermediates), also for roots `ca rotate` makes.
	SignsIntermediates bool `json:"signs_intermediates,omitempty"`
}

// JournalNote records a rotation event, newest last, for operators.
type JournalNote struct {
	At     time.Time `json:"at"`
	Event  string    `json:"event"`
	RootID string    `json:"root_id"`
	// KID names the JWT key of a JWT key event (RootID is empty then).
	KID string `json:"kid,omitempty"`
}

// maxJournalNotes bounds the event history kept in the journal.
const maxJournalNotes = 50

// RootRecord is one root in the journal.
type RootRecord struct {
	ID          string    `json:"id"` // hex serial number; names the files
	State       RootState `json:"state"`
	CertSHA256  string    `json:"cert_sha256"`
	PreparedAt  time.Time `json:"prepared_at"`
	ActivatedAt time.Time `json:"activated_at,omitzero"`
	RetiredAt   time.Time `json:"retired_at,omitzero"`
	// MinActivateAt is fixed when the root is prepared, from the refresh
	// hint published then: lowering the hint later must not shorten the
	// time peers had to fetch it.
	MinActivateAt time.Time `json:"min_activate_at,omitzero"`
	// PublishedAt is when a serving trustbridge first published the root
	// (or, after a restart, published it again). A root prepared by
	// `ca rotate` has none until the server picks it up, and the
	// publication lead counts from here.
	PublishedAt time.Time `json:"published_at,omitzero"`
	RemoveAfter time.Time `json:"remove_after,omitzero"`
	// Upstream is set on an intermediate an upstream signed
	// (Config.Upstream): the record then describes our signing
	// intermediate, not a root, and the bundle publishes its upstream
	// roots instead of it.
	Upstream *UpstreamRecord `json:"upstream,omitempty"`
	// KeyRef finds the root's key in the Config.Keys key manager; the
	// state then holds no private key for it.
	KeyRef string `json:"key_ref,omitempty"`
}

// Root is a root (or, in upstream mode, an intermediate) with its
// material.
type Root struct {
	RootRecord
	Cert *x509.Certificate
	Key  crypto.Signer
	// upstreamChain and upstreamRoots are RootRecord.Upstream parsed.
	upstreamChain []*x509.Certificate
	upstreamRoots []*x509.Certificate
}

// published are the certificates the bundle carries for r: its upstream
// roots for an intermediate, else r itself.
func (r *Root) published() []*x509.Certificate {
	if r.Upstream != nil {
		return r.upstreamRoots
	}
	return []*x509.Certificate{r.Cert}
}

// Store reads and writes CA state under a data directory.
type Store struct {
	dir string // <data-dir>/ca
	// saveErr, set by tests, makes Save fail as a full disk would.
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
	return filepath.Join(s.dir, rootsDirName, JWTKeyKey(kid))
}
func (s *Store) wrap(err error) error { return fmt.Errorf("ca: state in %s: %w", s.dir, err) }

// ensureDirs creates the state directory (0700) and refuses one another
// user could write to: they could plant a root key the CA would sign with.
func (s *Store) ensureDirs() error {
	if err := securedir.Ensure(s.dir); err != nil {
		return err
	}
	// roots/ holds the keys themselves: a writable one would let another
	// user plant one even under a tight state directory.
	return securedir.Ensure(filepath.Join(s.dir, rootsDirName))
}

func corrupt(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCorruptState}, a...)...)
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
func (s *Store) Load(td string) (*Journal, []*Root, error) {
	j, roots, _, _, err := s.load(td)
	return j, roots, err
}

// LoadWithJWTKeys is Load, with the JWT signing keys the journal names.
func (s *Store) LoadWithJWTKeys(td string) (*Journal, []*Root, []*JWTKey, error) {
	j, roots, keys, _, err := s.load(td)
	return j, roots, keys, err
}

// load is Load, with the JWT keys and the version (digest) of the journal
// it read.
func (s *Store) load(td string) (*Journal, []*Root, []*JWTKey, string, error) {
	for _, dir := range []string{s.dir, filepath.Join(s.dir, rootsDirName)} {
		if err := securedir.Check(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
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
	j, err := DecodeJournal(data, td)
	if err != nil {
		return nil, nil, nil, "", s.wrap(err)
	}
	roots := make([]*Root, 0, len(j.Roots))
	for _, rec := range j.Roots {
		r, err := s.loadRoot(rec)
		if err != nil {
			return nil, nil, nil, "", s.wrap(err)
		}
		roots = append(roots, r)
	}
	keys := make([]*JWTKey, 0, len(j.JWTKeys))
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
	data, _, err := cappedfile.Read(path, limit)
	if errors.Is(err, cappedfile.ErrTooLarge) || errors.Is(err, cappedfile.ErrNotRegular) {
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

func (s *Store) loadRoot(rec RootRecord) (*Root, error) {
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
	r, err := DecodeRoot(rec, certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%w (files in %s)", err, filepath.Join(s.dir, rootsDirName))
	}
	return r, nil
}

func (s *Store) loadJWTKey(rec JWTKeyRecord) (*JWTKey, error) {
	if rec.KeyRef != "" {
		return DecodeJWTKey(rec, nil)
	}
	keyPEM, err := readPrivateKeyFile(s.jwtKeyPath(rec.KID), "JWT key "+rec.KID)
	if err != nil {
		return nil, err
	}
	k, err := DecodeJWTKey(rec, keyPEM)
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
	if errors.Is(err, ErrCorruptState) {
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
// It must be followed by Save of a journal naming the key; until then the
// file is a leftover.
func (s *Store) writeJWTKeyOnce(k *JWTKey) error {
	if k.KeyRef != "" || fileExists(s.jwtKeyPath(k.KID)) {
		return nil
	}
	if err := s.ensureDirs(); err != nil {
		return s.wrap(err)
	}
	keyPEM, err := EncodeJWTKey(k)
	if err != nil {
		return s.wrap(err)
	}
	if err := atomicfile.Write(s.jwtKeyPath(k.KID), keyPEM, 0o600); err != nil {
		return s.wrap(err)
	}
	return nil
}

// WriteRoot writes a new root's key (0600) and certificate. It must be
// followed by Save of a journal naming the root; until then the files are
// leftovers. A nil key writes only the certificate: the root's key is in
// a key manager (RootRecord.KeyRef).
func (s *Store) WriteRoot(cert *x509.Certificate, key crypto.Signer) (string, error) {
	if err := s.ensureDirs(); err != nil {
		return "", s.wrap(err)
	}
	id := cert.SerialNumber.Text(16)
	if key != nil {
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return "", s.wrap(err)
		}
		if err := atomicfile.Write(s.keyPath(id), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			return "", s.wrap(err)
		}
	}
	if err := atomicfile.Write(s.certPath(id), pemCert(cert), 0o644); err != nil {
		return "", s.wrap(err)
	}
	return id, nil
}

// RemoveRootFiles deletes a root's files after a journal without it was
// saved.
func (s *Store) RemoveRootFiles(id string) error {
	for _, p := range []string{s.keyPath(id), s.certPath(id)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return s.wrap(err)
		}
	}
	return nil
}

// Save writes the journal atomically.
func (s *Store) Save(j *Journal) error {
	_, err := s.save(j)
	return err
}

// save is Save, returning the bytes written.
func (s *Store) save(j *Journal) ([]byte, error) {
	if s.saveErr != nil {
		return nil, s.wrap(s.saveErr)
	}
	if err := s.ensureDirs(); err != nil {
		return nil, s.wrap(err)
	}
	data, err := EncodeJournal(j)
	if err != nil {
		return nil, s.wrap(err)
	}
	if err := atomicfile.Write(s.journalPath(), data, 0o600); err != nil {
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
