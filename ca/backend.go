package ca

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/trustbridge/trustbridge/internal/leader/fence"
	"github.com/trustbridge/trustbridge/internal/pemfile"
)

// Sentinel errors of shared CA state.
var (
	// ErrConflict: another writer changed the CA state since this one read
	// it. Nothing was written; the writer reloads and decides again.
	ErrConflict = errors.New("CA state changed by another writer")
	// ErrNotLeader: this replica does not hold leadership, so it does not
	// change the CA state.
	ErrNotLeader = fence.ErrNotLeader
)

// Backend keeps the CA state: the journal and the material of every root
// and JWT key it names. The file store in --data-dir is the default;
// ca/kubestore keeps it in a Kubernetes Secret.
type Backend interface {
	// Load reads the journal and every root and JWT key it names, refusing
	// a journal of another trust domain than td (any, when td is empty),
	// and returns the version they were read at. No state yet is (nil,
	// nil, nil, "", nil). State that does not parse or check out is
	// ErrCorruptState.
	Load(td string) (j *Journal, roots []*Root, jwtKeys []*JWTKey, version string, err error)
	// Commit persists j together with the material of exactly roots and
	// jwtKeys (those j names), all or nothing, if the state is still at
	// version base ("" for none); otherwise it writes nothing and returns
	// an error wrapping ErrConflict. It returns the new version.
	Commit(base string, j *Journal, roots []*Root, jwtKeys []*JWTKey) (version string, err error)
	// Version is the state's current version, "" when there is none; a
	// change means another writer committed.
	Version() (string, error)
	// Lock serializes readers and writers sharing the state where the
	// backend can (the file store's flock); the func releases it.
	Lock(exclusive bool) (unlock func(), err error)
	// Describe names where the state lives, for messages.
	Describe() string
}

// Leader says whether this replica leads. Only the leader changes the CA
// state; see Config.Leader.
type Leader interface {
	IsLeader() bool
}

// LeaderFunc adapts a function to Leader.
type LeaderFunc func() bool

// IsLeader calls f.
func (f LeaderFunc) IsLeader() bool { return f() }

// MaxJournalSize bounds an encoded journal; larger ones are refused as
// corrupt.
const MaxJournalSize = maxJournal

// JournalKey names the journal inside a state store that holds named
// blobs (files, Secret keys); RootCertKey and RootKeyKey name a root's
// material.
const JournalKey = journalName

// RootCertKey is the name of root id's certificate.
func RootCertKey(id string) string { return id + ".crt.pem" }

// RootKeyKey is the name of root id's private key.
func RootKeyKey(id string) string { return id + ".key.pem" }

// EncodeJournal bounds j's event history, sets its format and returns the
// JSON written to the state store.
func EncodeJournal(j *Journal) ([]byte, error) {
	j.Format = journalFormat
	if len(j.Events) > maxJournalNotes {
		j.Events = j.Events[len(j.Events)-maxJournalNotes:]
	}
	data, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return nil, err
	}
	data = append(data, '\n')
	if len(data) > maxJournal {
		return nil, fmt.Errorf("journal of %d bytes is larger than the %d a load reads", len(data), maxJournal)
	}
	return data, nil
}

// DecodeJournal parses a journal and checks it: its format, its trust
// domain (any, when td is empty), unique and safe root ids, known states
// and at most one active root. Every refusal wraps ErrCorruptState.
func DecodeJournal(data []byte, td string) (*Journal, error) {
	if len(data) > maxJournal {
		return nil, corrupt("%s is larger than %d bytes", journalName, maxJournal)
	}
	var j Journal
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return nil, corrupt("%s does not parse: %v", journalName, err)
	}
	if dec.More() {
		return nil, corrupt("%s has data after the journal", journalName)
	}
	if j.Format != journalFormat {
		return nil, corrupt("%s has format %d, this trustbridge reads %d", journalName, j.Format, journalFormat)
	}
	if td != "" && j.TrustDomain != td {
		return nil, fmt.Errorf("%w: it belongs to trust domain %q, not %q; use another --data-dir", ErrCorruptState, j.TrustDomain, td)
	}
	seen := map[string]bool{}
	active := 0
	for i, rec := range j.Roots {
		if seen[rec.ID] || !safeRootID(rec.ID) {
			return nil, corrupt("%s: root %d has a missing, unsafe or duplicate id %q", journalName, i, rec.ID)
		}
		seen[rec.ID] = true
		switch rec.State {
		case StateActive:
			active++
		case StatePrepared, StateRetired:
		default:
			return nil, corrupt("%s: root %s has unknown state %q", journalName, rec.ID, rec.State)
		}
	}
	if active > 1 {
		return nil, corrupt("%s names %d active roots", journalName, active)
	}
	if err := checkUpstreamRecords(j.Roots); err != nil {
		return nil, err
	}
	if err := checkJWTRecords(j.JWTKeys); err != nil {
		return nil, err
	}
	return &j, nil
}

// safeRootID accepts ids that are safe as file names and Secret keys:
// root ids are hex serial numbers.
func safeRootID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// EncodeRoot returns r's certificate and PKCS#8 private key as PEM; the
// key is nil for a root whose key is in a key manager (KeyRef).
func EncodeRoot(r *Root) (certPEM, keyPEM []byte, err error) {
	if r.Cert != nil && r.KeyRef != "" {
		return pemCert(r.Cert), nil, nil
	}
	if r.Cert == nil || r.Key == nil {
		return nil, nil, fmt.Errorf("root %s has no certificate or no key", r.ID)
	}
	der, err := x509.MarshalPKCS8PrivateKey(r.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("root %s: %w", r.ID, err)
	}
	return pemCert(r.Cert), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// DecodeRoot parses the material of the root rec names and checks it: one
// PEM certificate whose fingerprint is the journal's, and a private key
// that matches it. A record with a KeyRef has no key in the state (keyPEM
// must be empty); its Key stays nil until the Authority finds it in its
// key manager. Every refusal wraps ErrCorruptState and never quotes
// the key.
func DecodeRoot(rec RootRecord, certPEM, keyPEM []byte) (*Root, error) {
	certs, err := pemfile.ParseCertificates(certPEM)
	if err != nil {
		return nil, corrupt("root %s: certificate: %v", rec.ID, err)
	}
	if len(certs) != 1 {
		return nil, corrupt("root %s: certificate file holds %d certificates, want 1", rec.ID, len(certs))
	}
	cert := certs[0]
	if fingerprint(cert) != rec.CertSHA256 {
		return nil, corrupt("root %s: certificate does not match the fingerprint in %s", rec.ID, journalName)
	}
	r := &Root{RootRecord: rec, Cert: cert}
	if r.Key, err = decodeRootKey(rec, cert, keyPEM); err != nil {
		return nil, err
	}
	if rec.Upstream != nil {
		if r.upstreamChain, r.upstreamRoots, err = decodeUpstreamRecord(rec.ID, cert, rec.Upstream); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// decodeRootKey parses the private key of the root rec names, nil for one
// in a key manager (rec.KeyRef), whose state must hold none.
func decodeRootKey(rec RootRecord, cert *x509.Certificate, keyPEM []byte) (crypto.Signer, error) {
	if rec.KeyRef != "" {
		if len(keyPEM) > 0 {
			return nil, corrupt("root %s: its key is in a key manager (ref %s), yet the state holds a private key for it", rec.ID, rec.KeyRef)
		}
		return nil, nil
	}
	key, err := pemfile.ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, corrupt("root %s: private key: %v", rec.ID, err)
	}
	if !publicKeysMatch(key.Public(), cert.PublicKey) {
		return nil, corrupt("root %s: private key does not match the certificate", rec.ID)
	}
	return key, nil
}

// checkCommit refuses to persist a journal whose roots and JWT keys are
// not exactly the ones given with material.
func checkCommit(j *Journal, roots []*Root, jwtKeys []*JWTKey) error {
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
		if !safeRootID(rec.ID) {
			return fmt.Errorf("unsafe root id %q", rec.ID)
		}
	}
	return nil
}

// fileBackend is the Backend of the data directory: Store, with the
// journal's digest as version.
type fileBackend struct{ s *Store }

func (b fileBackend) Load(td string) (*Journal, []*Root, []*JWTKey, string, error) {
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
func (b fileBackend) Commit(base string, j *Journal, roots []*Root, jwtKeys []*JWTKey) (string, error) {
	s := b.s
	if err := checkCommit(j, roots, jwtKeys); err != nil {
		return "", s.wrap(err)
	}
	cur, err := b.Version()
	if err != nil {
		return "", err
	}
	if cur != base {
		return "", s.wrap(fmt.Errorf("%w: %s changed since it was read", ErrConflict, journalName))
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
func (s *Store) writeMissingMaterial(roots []*Root, jwtKeys []*JWTKey) (map[string]bool, error) {
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
		id, err := s.WriteRoot(r.Cert, key)
		if err != nil {
			return nil, err
		}
		if id != r.ID {
			return nil, s.wrap(fmt.Errorf("root %s: certificate serial names it %s", r.ID, id))
		}
	}
	for _, k := range jwtKeys {
		keep[strings.TrimSuffix(JWTKeyKey(k.KID), ".key.pem")] = true
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
			_ = s.RemoveRootFiles(id)
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

// maxUpstreamName bounds an upstream's recorded name.
const maxUpstreamName = 256

// checkUpstreamRecords refuses a journal that mixes self-signed roots
// with intermediates an upstream signed (no mode publishes both), and
// upstream records that are plainly damaged; decodeUpstreamRecord checks
// their certificates.
func checkUpstreamRecords(recs []RootRecord) error {
	upstream := 0
	for _, rec := range recs {
		if rec.Upstream == nil {
			continue
		}
		upstream++
		u := rec.Upstream
		if len(u.Name) > maxUpstreamName || u.ObtainedAt.IsZero() || len(u.Roots) == 0 {
			return corrupt("%s: intermediate %s has an upstream record without roots, time obtained, or with a name over %d bytes", journalName, rec.ID, maxUpstreamName)
		}
	}
	if upstream > 0 && upstream != len(recs) {
		return corrupt("%s mixes %d self-signed roots with %d upstream-signed intermediates", journalName, len(recs)-upstream, upstream)
	}
	return nil
}
