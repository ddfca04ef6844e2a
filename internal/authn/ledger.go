package authn

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/fileutil"
)

var (
	// ErrTokenConsumed means a single-use bootstrap token was already
	// spent on a certificate, by an earlier request or by a concurrent
	// one that got there first. It is always wrapped.
	ErrTokenConsumed = errors.New("bootstrap token already consumed")
	// ErrTokenExpired means a bootstrap token is past the expires= of its
	// line. It is always wrapped.
	ErrTokenExpired = errors.New("bootstrap token expired")
)

// Consumption records a single-use bootstrap token spent on a certificate.
type Consumption struct {
	// Ref is the token's BootstrapGrantRef: never the token, nor the
	// digest the token file is matched by.
	Ref string
	// ID is the identity the token granted.
	ID spiffeid.ID
	// At is when the certificate was issued, in whole seconds.
	At time.Time
}

// TokenLedger remembers which single-use bootstrap tokens were consumed.
// Consume is atomic: of calls for one reference, in this process or, for
// a shared ledger, in any replica, exactly one succeeds and the others get
// an error wrapping ErrTokenConsumed. A consumption is never undone.
// FileLedger, KubeLedger and MemoryLedger implement it.
type TokenLedger interface {
	// Consumed reports whether ref was consumed, and the record if so.
	Consumed(ctx context.Context, ref string) (Consumption, bool, error)
	// Consume records c, or fails with ErrTokenConsumed when c.Ref was
	// consumed already.
	Consume(ctx context.Context, c Consumption) error
}

// checkConsumption applies the shape rules every ledger shares.
func checkConsumption(c Consumption) error {
	if err := checkLedgerRef(c.Ref); err != nil {
		return err
	}
	if c.ID.IsZero() {
		return errors.New("no SPIFFE ID")
	}
	if c.At.IsZero() {
		return errors.New("no time")
	}
	return nil
}

// checkLedgerRef accepts what BootstrapGrantRef returns and nothing else,
// so a ledger key is never anything a token could be.
func checkLedgerRef(ref string) error {
	if len(ref) != 2*bootstrapRefBytes {
		return fmt.Errorf("reference of %d characters, want %d", len(ref), 2*bootstrapRefBytes)
	}
	if _, err := hex.DecodeString(ref); err != nil || bytes.ContainsAny([]byte(ref), "ABCDEF") {
		return errors.New("reference is not lowercase hex")
	}
	return nil
}

// MemoryLedger is a TokenLedger in memory: consumption lasts as long as
// the value. For tests, and for tools that check tokens without issuing.
type MemoryLedger struct {
	mu       sync.Mutex
	consumed map[string]Consumption
}

var _ TokenLedger = (*MemoryLedger)(nil)

// NewMemoryLedger returns an empty MemoryLedger.
func NewMemoryLedger() *MemoryLedger {
	return &MemoryLedger{consumed: map[string]Consumption{}}
}

// Consumed reports whether ref was consumed.
func (m *MemoryLedger) Consumed(_ context.Context, ref string) (Consumption, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.consumed[ref]
	return c, ok, nil
}

// Consume records c unless its reference was consumed already.
func (m *MemoryLedger) Consume(_ context.Context, c Consumption) error {
	if err := checkConsumption(c); err != nil {
		return fmt.Errorf("authn: ledger: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.consumed[c.Ref]; ok {
		return fmt.Errorf("authn: ledger: reference %s: %w", c.Ref, ErrTokenConsumed)
	}
	m.consumed[c.Ref] = c
	return nil
}

// Ledger file limits.
const (
	// LedgerFileName is the FileLedger's file in the server's data
	// directory.
	LedgerFileName = "bootstrap-tokens-consumed.json"
	// MaxLedgerFileSize bounds what OpenFileLedger reads: about 100,000
	// consumed tokens.
	MaxLedgerFileSize = 16 << 20
	ledgerVersion     = 1
)

// FileLedger is a TokenLedger in one JSON file (in the server's data
// directory), rewritten atomically (internal/fileutil: temporary file,
// fsync, rename) with mode 0600 on every consumption, so a consumption
// survives a crash and a restart, and a reader never sees half a file. A
// process keeps the file's content in memory and is its only writer: the
// data directory has one server.
type FileLedger struct {
	path string

	mu       sync.Mutex // serializes Consume; guards consumed
	consumed map[string]Consumption
}

var _ TokenLedger = (*FileLedger)(nil)

// ledgerFile is the file's JSON form.
type ledgerFile struct {
	Version  int                    `json:"version"`
	Consumed map[string]ledgerEntry `json:"consumed"`
}

// ledgerEntry is one consumption, keyed by reference; KubeLedger stores
// the same form.
type ledgerEntry struct {
	SPIFFEID   string    `json:"spiffe_id"`
	ConsumedAt time.Time `json:"consumed_at"`
}

// OpenFileLedger reads the ledger at path; a missing file is an empty
// ledger, created on the first consumption. A file that does not parse is
// an error: starting without it would make every token it records usable
// again.
func OpenFileLedger(path string) (*FileLedger, error) {
	data, _, err := fileutil.ReadFile(path, MaxLedgerFileSize)
	if errors.Is(err, fs.ErrNotExist) {
		return &FileLedger{path: path, consumed: map[string]Consumption{}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("authn: consumed-token ledger: %w", err)
	}
	consumed, err := parseLedger(data)
	if err != nil {
		return nil, fmt.Errorf("authn: consumed-token ledger %s: %w; it records which single-use bootstrap tokens were spent: restore it from a backup, or, "+
			"knowing that every token it recorded becomes usable again, move it aside and remove or replace every single-use token in the token file", path, err)
	}
	return &FileLedger{path: path, consumed: consumed}, nil
}

// parseLedger decodes a ledger file strictly: one JSON object of the
// current version, no unknown fields, every entry well formed.
func parseLedger(data []byte) (map[string]Consumption, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f ledgerFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("not a ledger: %w", err)
	}
	if dec.More() {
		return nil, errors.New("not a ledger: data after the JSON object")
	}
	if f.Version != ledgerVersion {
		return nil, fmt.Errorf("version %d, want %d", f.Version, ledgerVersion)
	}
	consumed := make(map[string]Consumption, len(f.Consumed))
	for ref, e := range f.Consumed {
		c, err := e.consumption(ref)
		if err != nil {
			return nil, err
		}
		consumed[ref] = c
	}
	return consumed, nil
}

// consumption checks and converts the entry stored under ref.
func (e ledgerEntry) consumption(ref string) (Consumption, error) {
	if err := checkLedgerRef(ref); err != nil {
		// Not quoted: it could be a token pasted in by mistake.
		return Consumption{}, fmt.Errorf("an entry's key is not a token reference: %w", err)
	}
	id, err := spiffeid.FromString(e.SPIFFEID)
	if err != nil {
		return Consumption{}, fmt.Errorf("entry %s: spiffe_id: %w", ref, err)
	}
	c := Consumption{Ref: ref, ID: id, At: e.ConsumedAt.UTC()}
	if err := checkConsumption(c); err != nil {
		return Consumption{}, fmt.Errorf("entry %s: %w", ref, err)
	}
	return c, nil
}

func entryOf(c Consumption) ledgerEntry {
	return ledgerEntry{SPIFFEID: c.ID.String(), ConsumedAt: c.At.UTC()}
}

// encodeLedger is the file's content for consumed; map keys come out
// sorted, so equal ledgers are equal files.
func encodeLedger(consumed map[string]Consumption) ([]byte, error) {
	f := ledgerFile{Version: ledgerVersion, Consumed: make(map[string]ledgerEntry, len(consumed))}
	for ref, c := range consumed {
		f.Consumed[ref] = entryOf(c)
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// Path is the ledger's file.
func (l *FileLedger) Path() string { return l.path }

// Len is the number of consumed tokens recorded.
func (l *FileLedger) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.consumed)
}

// Consumed reports whether ref was consumed.
func (l *FileLedger) Consumed(_ context.Context, ref string) (Consumption, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.consumed[ref]
	return c, ok, nil
}

// Consume writes the ledger with c added; only once the file is replaced
// does the consumption count, so a failed write leaves the token usable.
func (l *FileLedger) Consume(_ context.Context, c Consumption) error {
	if err := checkConsumption(c); err != nil {
		return fmt.Errorf("authn: ledger: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.consumed[c.Ref]; ok {
		return fmt.Errorf("authn: ledger %s: reference %s: %w", l.path, c.Ref, ErrTokenConsumed)
	}
	next := maps.Clone(l.consumed)
	next[c.Ref] = c
	data, err := encodeLedger(next)
	if err != nil {
		return fmt.Errorf("authn: ledger %s: %w", l.path, err)
	}
	if len(data) > MaxLedgerFileSize {
		return fmt.Errorf("authn: ledger %s: %d consumed tokens fill the %d bytes a load reads; remove the lines of consumed or expired tokens from the token file and "+
			"the entries with their references from the ledger, with the server stopped", l.path, len(next), MaxLedgerFileSize)
	}
	if err := fileutil.Write(l.path, data, 0o600); err != nil {
		return fmt.Errorf("authn: ledger: %w", err)
	}
	l.consumed = next
	return nil
}
