package federation

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/fileutil"
)

// Layout of the last-known-good store.
const (
	lkgDirName = "federation"
	lkgExt     = ".json"
	// Bundles are public material; the directory is private all the same,
	// since nobody else has any business adding trust to it.
	lkgDirPerm  = 0o700
	lkgFilePerm = 0o644
	// maxLKGFileSize caps what Load reads: a fetched bundle is capped at
	// bundledoc.DefaultMaxSize by default, and the headroom covers the
	// envelope, so any bundle the fetcher accepts at that cap persists.
	// Save refuses to write a file Load would refuse to read.
	maxLKGFileSize = bundledoc.DefaultMaxSize + 64<<10
)

// LastKnownGood persists the last known good bundle of each federated
// trust domain. LKGStore keeps them in files under --data-dir;
// federation/kubelkg keeps them in ConfigMaps shared by replicas.
type LastKnownGood interface {
	// Load returns td's entry, or (nil, nil) when there is none. An entry
	// that cannot be read or checked is an error, never silently dropped.
	Load(td spiffeid.TrustDomain) (*LKGEntry, error)
	// Save replaces td's entry.
	Save(e LKGEntry) error
}

var _ LastKnownGood = (*LKGStore)(nil)

// LKGStore persists the last known good bundle of each federated trust
// domain under <data-dir>/federation, one file per trust domain, so that a
// restart with every remote endpoint down still trusts what it trusted
// before (SPIFFE Federation §6.2: store the latest bundle). Writes are
// atomic. It holds no state beyond its directory and is safe for concurrent
// use; concurrent Saves of one trust domain leave one of them whole.
type LKGStore struct {
	dir string
}

// NewLKGStore returns the store under dataDir. It touches no files: the
// directory is created by the first Save.
func NewLKGStore(dataDir string) *LKGStore {
	return &LKGStore{dir: filepath.Join(dataDir, lkgDirName)}
}

// Dir is the directory the store keeps its files in.
func (s *LKGStore) Dir() string { return s.dir }

// LKGEntry is one persisted bundle with what is needed to resume polling
// and to explain where it came from (§7.6).
type LKGEntry struct {
	TrustDomain spiffeid.TrustDomain
	Bundle      *spiffebundle.Bundle
	// ETag is the validator of the fetched document, for If-None-Match.
	// It is only meaningful while EndpointURL is still the configured URL.
	ETag string
	// EndpointURL is the configured URL the bundle was fetched from, for
	// display and for the check above; never a redirect target and never
	// a URL to poll (§7.5.1).
	EndpointURL string
	FetchedAt   time.Time
	// Revoked is the trust domain's revoked set when the bundle was saved
	// (issue 38), so that a restart still refuses what it revoked.
	Revoked []Revoked
}

// lkgFile is the on-disk envelope. The bundle is the canonical document
// from bundledoc.Marshal, embedded as JSON so the file reads with jq.
// Unknown members are ignored, so an older trustbridge can read a newer
// file.
type lkgFile struct {
	TrustDomain string          `json:"trust_domain"`
	EndpointURL string          `json:"endpoint_url,omitempty"`
	ETag        string          `json:"etag,omitempty"`
	FetchedAt   time.Time       `json:"fetched_at"`
	Bundle      json.RawMessage `json:"bundle"`
	// Revoked is MarshalRevoked's; files written before issue 38 have
	// none.
	Revoked json.RawMessage `json:"revoked,omitempty"`
}

// path is the file of td. Names are checked as everywhere a document or
// config names a trust domain; go-spiffe's names hold only [a-z0-9._-], so
// the result cannot leave the directory.
func (s *LKGStore) path(td spiffeid.TrustDomain) (string, error) {
	if td.IsZero() {
		return "", errors.New("no trust domain given")
	}
	if _, err := bundledoc.TrustDomainName(td.Name()); err != nil {
		return "", fmt.Errorf("trust domain %q: %w", td.Name(), err)
	}
	return filepath.Join(s.dir, td.Name()+lkgExt), nil
}

// Save writes e as the last known good bundle of e.TrustDomain, replacing
// any earlier one atomically.
func (s *LKGStore) Save(e LKGEntry) error {
	p, err := s.path(e.TrustDomain)
	if err != nil {
		return fmt.Errorf("federation: last-known-good: %w", err)
	}
	name := e.TrustDomain.Name()
	if e.Bundle == nil {
		return fmt.Errorf("federation: last-known-good for %q: no bundle", name)
	}
	if got := e.Bundle.TrustDomain(); got != e.TrustDomain {
		return fmt.Errorf("federation: last-known-good for %q: bundle is for trust domain %q", name, got.Name())
	}
	doc, err := bundledoc.Marshal(e.Bundle)
	if err != nil {
		return fmt.Errorf("federation: last-known-good for %q: %w", name, err)
	}
	revoked, err := MarshalRevoked(e.Revoked)
	if err != nil {
		return fmt.Errorf("federation: last-known-good for %q: %w", name, err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// Keep the bundle's bytes as Marshal wrote them.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(lkgFile{
		TrustDomain: name,
		EndpointURL: e.EndpointURL,
		ETag:        e.ETag,
		FetchedAt:   e.FetchedAt.UTC(),
		Bundle:      doc,
		Revoked:     revoked,
	}); err != nil {
		return fmt.Errorf("federation: last-known-good for %q: %w", name, err)
	}
	if buf.Len() > maxLKGFileSize {
		return fmt.Errorf("federation: last-known-good for %q: %d bytes is more than the %d a load would read", name, buf.Len(), maxLKGFileSize)
	}
	if err := os.MkdirAll(s.dir, lkgDirPerm); err != nil {
		return fmt.Errorf("federation: last-known-good: %w", err)
	}
	if err := fileutil.Write(p, buf.Bytes(), lkgFilePerm); err != nil {
		return fmt.Errorf("federation: last-known-good %s: %w", p, err)
	}
	return nil
}

// Load returns the last known good bundle of td, or (nil, nil) when there
// is none. A file that cannot be read, does not parse, is too large, or
// names another trust domain is an error naming the file: it is never
// silently dropped, and the caller decides whether to start without it.
// The bundle is parsed again with bundledoc.Parse for td, so nothing on
// disk bypasses the checks a fetched bundle goes through.
func (s *LKGStore) Load(td spiffeid.TrustDomain) (*LKGEntry, error) {
	p, err := s.path(td)
	if err != nil {
		return nil, fmt.Errorf("federation: last-known-good: %w", err)
	}
	e, err := loadLKG(p, td)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("federation: last-known-good %s: %w", p, err)
	}
	return e, nil
}

func loadLKG(path string, td spiffeid.TrustDomain) (*LKGEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("is not a regular file (%s)", fi.Mode().Type())
	}
	data, err := bundledoc.ReadLimited(f, maxLKGFileSize)
	if err != nil {
		return nil, err
	}
	var lf lkgFile
	if err := json.Unmarshal(data, &lf); err != nil {
		return nil, fmt.Errorf("envelope: %w", err)
	}
	fileTD, err := bundledoc.TrustDomainName(lf.TrustDomain)
	switch {
	case lf.TrustDomain == "":
		return nil, errors.New("envelope: trust_domain is missing")
	case err != nil:
		return nil, fmt.Errorf("envelope: trust_domain %q: %w", lf.TrustDomain, err)
	case fileTD != td:
		// A file copied or renamed from another trust domain must never
		// add that domain's keys as roots of this one (§4.2, §7.3).
		return nil, fmt.Errorf("holds the bundle of trust domain %q, not %q", fileTD.Name(), td.Name())
	case len(lf.Bundle) == 0 || string(lf.Bundle) == "null":
		return nil, errors.New("envelope: bundle is missing")
	}
	b, err := ParseStoredBundle(td, lf.Bundle)
	if err != nil {
		return nil, err
	}
	revoked, err := ParseStoredRevoked(lf.Revoked)
	if err != nil {
		return nil, err
	}
	return &LKGEntry{
		TrustDomain: td,
		Bundle:      b,
		ETag:        lf.ETag,
		EndpointURL: lf.EndpointURL,
		FetchedAt:   lf.FetchedAt,
		Revoked:     revoked,
	}, nil
}

// LoadAll loads every file in the store. Entries that load are returned
// even when others fail; each failure is an error naming its file, in file
// name order. A missing directory is an empty store. Files of trust
// domains no longer configured are returned too: the caller keeps only the
// configured ones, so that removing a federation from the config removes
// the trust.
func (s *LKGStore) LoadAll() (map[spiffeid.TrustDomain]*LKGEntry, []error) {
	out := make(map[spiffeid.TrustDomain]*LKGEntry)
	des, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return out, []error{fmt.Errorf("federation: last-known-good: %w", err)}
	}
	var errs []error
	for _, de := range des {
		name := de.Name()
		// atomicfile's temporary files (".<name>.json.tmp-*") do not end in
		// .json, so they are never taken for entries.
		stem, ok := strings.CutSuffix(name, lkgExt)
		if !ok {
			continue
		}
		p := filepath.Join(s.dir, name)
		td, err := bundledoc.TrustDomainName(stem)
		if err != nil {
			errs = append(errs, fmt.Errorf("federation: last-known-good %s: file name %q is not a trust domain: %w", p, stem, err))
			continue
		}
		e, err := loadLKG(p, td)
		if err != nil {
			errs = append(errs, fmt.Errorf("federation: last-known-good %s: %w", p, err))
			continue
		}
		out[td] = e
	}
	return out, errs
}

// Remove deletes the last known good bundle of td; a missing one is not an
// error. The directory is synced so that a crash cannot bring back a bundle
// whose trust was withdrawn.
func (s *LKGStore) Remove(td spiffeid.TrustDomain) error {
	p, err := s.path(td)
	if err != nil {
		return fmt.Errorf("federation: last-known-good: %w", err)
	}
	if err := os.Remove(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("federation: last-known-good %s: %w", p, err)
	}
	d, err := os.Open(s.dir)
	if err != nil {
		return fmt.Errorf("federation: last-known-good: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("federation: last-known-good: %w", err)
	}
	return nil
}

// ParseStoredBundle parses a last-known-good store's bundle document for
// td by the rules a fetched one meets: refused when fetched (CheckBundle),
// so refused when stored, and an edited store cannot bring it in. Errors
// start with "bundle: ".
func ParseStoredBundle(td spiffeid.TrustDomain, raw []byte) (*spiffebundle.Bundle, error) {
	b, warnings, err := bundledoc.Parse(td, raw)
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	if err := RefusedWarning(warnings); err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	return b, nil
}
