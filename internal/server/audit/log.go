// Package audit keeps trustbridge's audit trail and judges what a server
// trusts.
//
// The trail is JSON lines, one Entry per trust change: roots prepared,
// activated, retired and removed, federated bundles accepted and refused,
// federation endpoints added, changed and removed. Entries are hash-chained:
// each holds the SHA-256 of the previous line as written (Prev) and of its
// own content (Hash), so Verify finds any entry edited, dropped, inserted
// or reordered. A chain cannot show that its newest entries were cut off;
// compare the head Verify reports with one recorded elsewhere (the server
// logs the head of every entry it appends) for that.
//
// A log file has one writer: Open takes an exclusive lock on it and
// appends with O_APPEND, syncing each entry. A write that fails part-way
// (a full disk, a file size limit) is undone: the file is truncated back
// to the last whole entry, so the next entry still links to it. A crash in
// the middle of a write leaves a torn final line (bytes after the last
// newline); Verify reports it as ErrTornTail, distinct from ErrBroken, and
// Open moves those bytes into a file of their own beside the log
// (<log>.torn-after-<seq>-<sha256 prefix>), logs a warning and records a
// log_recovered entry naming that file: nothing is lost, and nothing is
// appended after bytes that are not an entry. Anything else that does not
// verify (a bad line followed by others, a whole final line that fails its
// hash) is tamper evidence, and Open refuses it.
//
// Findings judges a api.Snapshot by the rules `trustbridge audit`
// applies: authorities near expiry, weak keys and signatures, non-CA
// certificates in bundles, stale federation, sequence regressions, a root
// trusted for two trust domains, endpoints that are not https or that
// served the other federation profile, an authority of the local CA
// tainted and not yet revoked.
package audit

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/trustbridge/trustbridge/internal/datadir"
	"github.com/trustbridge/trustbridge/internal/fileutil"
)

// MaxLineSize bounds one entry as written and as read back.
const MaxLineSize = 64 << 10

// Entry is one trust change.
type Entry struct {
	// Seq numbers entries from 1 in the order they were appended.
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Actor is the replica that made the change (its leader-election
	// identity, or the host name).
	Actor string `json:"actor"`
	// Event: root_prepared, root_activated, root_retired, root_removed,
	// root_loaded, root_tainted, root_revoked, jwt_key_prepared,
	// jwt_key_activated, jwt_key_retired, jwt_key_removed,
	// jwt_key_tainted, jwt_key_revoked (the CA's JWT signing keys): the
	// states the CA's authorities enter, as the server observes them,
	// whatever made the change (its own rotation, an operator through
	// the leader, a restart, a follower's reload); each transition is
	// recorded once. ca_authority_prepared, ca_authority_activated,
	// ca_authority_tainted, ca_authority_revoked: an operator's change
	// through the admin API (`trustbridge ca authority`), with who asked
	// (admin-socket or admin-token) and how (--now, --force) in Reason;
	// the state it led to is recorded too, as a root_* or jwt_key_* entry.
	// x509_svid_minted, jwt_svid_minted: an SVID an operator minted
	// through the admin API (`x509 mint`, `jwt mint --spiffe-id`), its
	// SPIFFE ID, serial or key, expiry and who asked in Reason.
	// pod_certificate_issued, pod_certificate_denied,
	// pod_certificate_failed: a PodCertificateRequest's outcome
	// (--pod-certificate-signer), the pod and the SPIFFE ID or the reason.
	// bundle_accepted, bundle_rejected, endpoint_added,
	// endpoint_changed, endpoint_removed, baseline, log_recovered (Open
	// moved a torn final line out of the log; Reason says how many bytes
	// and into which file), trust_policy_changed, trust_policy_rejected
	// (Reason holds the error; the previous policy stays),
	// ca_check_failed and ca_check_recovered (the CA's scheduled checks
	// start and cease to fail: a key manager refusing a new key, no valid
	// intermediate left; Reason holds the error), upstream_failed and
	// upstream_recovered (an upstream authority's outage starts and ends;
	// one entry each per outage, not per retry), log_level_changed (an
	// operator's `trustbridge log level`: from what to what, by whom, in
	// Reason), bootstrap_tokens_reloaded (an operator's reload of
	// --bootstrap-token-file through the admin API, `trustbridge token
	// revoke`: who asked, admin-socket or admin-token, and how many tokens
	// were added, removed and are in force, or why the file did not load,
	// in Reason), federation_updated (a federation relationship changed at
	// run time: who asked, and each change of endpoint URL, profile,
	// endpoint SPIFFE ID (old → new) and bootstrap bundle, in Reason).
	Event       string  `json:"event"`
	TrustDomain string  `json:"trust_domain"`
	SourceURL   string  `json:"source_url,omitempty"`
	OldSequence *uint64 `json:"old_sequence,omitempty"`
	NewSequence *uint64 `json:"new_sequence,omitempty"`
	// Added and Removed are authority fingerprints ("x509:<sha256>",
	// "jwt:<kid>:<sha256>").
	Added   []string `json:"fingerprints_added,omitempty"`
	Removed []string `json:"fingerprints_removed,omitempty"`
	Reason  string   `json:"reason,omitempty"`
	// Policy is set on trust_policy_changed and trust_policy_rejected.
	Policy *PolicyChange `json:"policy,omitempty"`
	// Prev is the SHA-256 (hex) of the previous entry's line, without its
	// newline; empty for the first entry of a chain.
	Prev string `json:"prev"`
	// Hash is the SHA-256 (hex) of this entry's JSON with Hash empty.
	Hash string `json:"hash"`
}

// contentHash is the SHA-256 of e's JSON with Hash empty.
func contentHash(e Entry) (string, error) {
	e.Hash = ""
	b, err := json.Marshal(e)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

func lineHash(line []byte) string {
	sum := sha256.Sum256(line)
	return hex.EncodeToString(sum[:])
}

// file is what a Log needs of the file it appends to; *os.File has it.
// Tests inject one that fails part-way.
type file interface {
	io.ReadWriteSeeker
	Sync() error
	Truncate(size int64) error
	Close() error
}

// Log appends entries to a chain. It is safe for concurrent use.
type Log struct {
	mu   sync.Mutex
	w    io.Writer
	file file // nil for a plain writer
	seq  uint64
	head string // line hash of the last entry
	now  func() time.Time
	// size is the file's length up to the end of the last entry written
	// whole: where a failed write is truncated back to.
	size int64
	// stuck is set when a failed write could not be undone: appending
	// after its partial bytes would break the chain, so nothing more is
	// appended until Open moves them aside as a torn tail.
	stuck error
	// recovered is the file Open moved a torn final line into.
	recovered string
}

// Option is an optional setting of Open.
type Option interface{ apply(*options) }

type options struct {
	logger *slog.Logger
	actor  string
	now    func() time.Time
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

// WithLogger sets where Open warns about a torn final line it moved aside.
// Default: discard.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) {
		if l != nil {
			o.logger = l
		}
	})
}

// WithActor names the replica in the log_recovered entry Open appends.
func WithActor(actor string) Option {
	return optionFunc(func(o *options) { o.actor = actor })
}

// withClock sets the time of the entries Open appends itself (tests).
func withClock(now func() time.Time) Option {
	return optionFunc(func(o *options) { o.now = now })
}

// New starts a new chain on w (standard output, say). A stream cannot be
// rewound: a write to w that fails part-way leaves its bytes there, so
// only a file opened with Open survives a full disk with its chain whole.
func New(w io.Writer) *Log {
	return &Log{w: w, now: time.Now}
}

// Open appends to the chain in the file at path, creating it (mode 0600)
// when missing, and holds an exclusive lock on it until Close: a second
// writer would interleave its entries with ours and break the chain, so a
// file another process holds open through Open is refused. An existing
// file is verified first: a chain that does not verify is never appended
// to, since an entry after a tampered one would seem to vouch for it; Open
// fails and says to move the file aside. The one exception is a torn final
// line, which only a write cut short leaves (entries are written whole,
// newline last): Open copies its bytes into a file of their own beside the
// log, truncates them away, logs a warning and appends a log_recovered
// entry naming that file, so the gap is itself on the record and the
// bytes are kept as they were.
func Open(path string, opts ...Option) (*Log, error) {
	// O_APPEND: every write lands at the end of the file, whatever the
	// offset, so even a writer that ignored the lock could not overwrite
	// an entry.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if err := datadir.LockFile(f); err != nil {
		f.Close()
		if errors.Is(err, datadir.ErrHeld) {
			return nil, fmt.Errorf("audit: %s is being appended to by another process (a second server?); an audit log has one writer: %w", path, err)
		}
		return nil, fmt.Errorf("audit: lock %s: %w", path, err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("audit: %w", err)
	}
	if info.Mode().Perm()&0o077 != 0 {
		if err := f.Chmod(0o600); err != nil {
			f.Close()
			return nil, fmt.Errorf("audit: %s: %w", path, err)
		}
	}
	return openFile(f, path, opts...)
}

// openFile is Open on a file already opened; it closes f on failure.
func openFile(f file, path string, opts ...Option) (*Log, error) {
	o := options{logger: slog.New(slog.DiscardHandler), now: time.Now}
	for _, opt := range opts {
		opt.apply(&o)
	}
	res, err := Verify(f)
	torn := errors.Is(err, ErrTornTail)
	if err != nil && !torn {
		f.Close()
		return nil, fmt.Errorf("audit: %s does not verify, so nothing is appended to it (move it aside to start a new chain; keep it as evidence): %w", path, err)
	}
	l := &Log{w: f, file: f, seq: res.Entries, head: res.Head, now: o.now, size: res.Bytes}
	if torn {
		if err := l.recoverTornTail(path, res, o); err != nil {
			f.Close()
			return nil, err
		}
		return l, nil
	}
	if _, err := f.Seek(res.Bytes, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("audit: %w", err)
	}
	return l, nil
}

// recoverTornTail moves the torn final line after the entries res
// verified into a file of its own, truncates it away and records that in
// the chain. The copy is on disk before the log is cut, so a crash or a
// failure at any step loses nothing.
func (l *Log) recoverTornTail(path string, res VerifyResult, o options) error {
	aside, err := keepTornTail(l.file, path, res)
	if err != nil {
		return fmt.Errorf("audit: %s: keeping its torn final line (%d bytes after entry %d) in a file of its own: %w", path, res.TornBytes, res.Entries, err)
	}
	if err := l.undo(); err != nil {
		return fmt.Errorf("audit: %s: dropping its torn final line (%d bytes after entry %d) from the log, a copy of which is in %s: %w", path, res.TornBytes, res.Entries, aside, err)
	}
	l.recovered = aside
	o.logger.Warn("audit log ended in a torn write (a crash or a full disk cut an entry short); moved the torn bytes to a file of their own and continued the chain",
		"path", path, "torn_file", aside, "torn_bytes", res.TornBytes, "torn_sha256", res.TornSHA256, "audit_seq", res.Entries, "audit_head", res.Head)
	err = l.Append(Entry{Actor: o.actor, Event: "log_recovered",
		Reason: fmt.Sprintf("moved a torn final line of %d bytes (sha256 %s) after entry %d (head %s) out of the log into %s",
			res.TornBytes, res.TornSHA256, res.Entries, res.Head, filepath.Base(aside))})
	if err != nil {
		return fmt.Errorf("audit: %s: recording the recovery of its torn final line (kept in %s): %w", path, aside, err)
	}
	return nil
}

// TornTailSuffix begins the suffix of the file a torn final line is
// moved into: <log>.torn-after-<seq>-<first 16 hex digits of its SHA-256>.
const TornTailSuffix = ".torn-after-"

// keepTornTail copies the torn bytes after res.Bytes into a new file
// beside path (mode 0600, synced, its directory synced) and returns its
// name. The name is fixed by the bytes, so a start that failed after the
// copy finds it again and goes on.
func keepTornTail(f file, path string, res VerifyResult) (string, error) {
	if _, err := f.Seek(res.Bytes, io.SeekStart); err != nil {
		return "", err
	}
	torn, err := io.ReadAll(io.LimitReader(f, MaxLineSize+1))
	if err != nil {
		return "", err
	}
	if sum := sha256.Sum256(torn); hex.EncodeToString(sum[:]) != res.TornSHA256 {
		return "", errors.New("the torn bytes changed while being read")
	}
	name := fmt.Sprintf("%s%s%d-%s", path, TornTailSuffix, res.Entries, ShortHash(res.TornSHA256))
	// An earlier start that kept the same bytes (and then failed) left
	// this name; other bytes under it are evidence too, never replaced.
	// The log's lock keeps other writers of the name away.
	switch kept, err := os.ReadFile(name); {
	case err == nil && bytes.Equal(kept, torn):
		return name, nil
	case err == nil:
		return "", fmt.Errorf("%s exists and holds other bytes; move it away", name)
	case !errors.Is(err, fs.ErrNotExist):
		return "", err
	}
	if err := fileutil.Write(name, torn, 0o600); err != nil {
		return "", err
	}
	return name, nil
}

// Recovered is the file Open moved a torn final line into; "" when the
// log ended whole.
func (l *Log) Recovered() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.recovered
}

// Head is the line hash of the newest entry and the number of entries.
func (l *Log) Head() (string, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.head, l.seq
}

// Append sets e's Seq, Time (when zero), Prev and Hash, writes it as one
// line, and syncs a file to disk before returning. When the write or the
// sync fails, the file is truncated back to the previous entry and the
// error says so: the chain stays whole and the next Append links to the
// last entry written.
func (l *Log) Append(e Entry) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stuck != nil {
		return fmt.Errorf("audit: entry not written: an earlier failed write could not be undone, so nothing more is appended until the log is reopened (which moves the torn bytes aside): %w", l.stuck)
	}
	e.Seq = l.seq + 1
	if e.Time.IsZero() {
		e.Time = l.now()
	}
	e.Time = e.Time.UTC()
	e.Prev = l.head
	h, err := contentHash(e)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	e.Hash = h
	line, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	if len(line)+1 > MaxLineSize {
		return fmt.Errorf("audit: entry of %d bytes exceeds %d", len(line), MaxLineSize)
	}
	if err := l.write(e.Seq, append(line, '\n')); err != nil {
		return err
	}
	l.seq, l.head = e.Seq, lineHash(line)
	l.size += int64(len(line)) + 1
	return nil
}

// write writes one line and syncs it; on failure it undoes the write.
// A failed sync undoes it too: the bytes may never reach the disk, and the
// caller is told the entry was not written.
func (l *Log) write(seq uint64, line []byte) error {
	_, err := l.w.Write(line)
	if err == nil && l.file != nil {
		err = l.file.Sync()
	}
	switch {
	case err == nil:
		return nil
	case l.file == nil:
		return fmt.Errorf("audit: entry %d not written: %w", seq, err)
	}
	if uerr := l.undo(); uerr != nil {
		l.stuck = fmt.Errorf("entry %d: %w; truncating back to %d bytes: %w", seq, err, l.size, uerr)
		return fmt.Errorf("audit: entry %d not written and its partial bytes could not be removed, so nothing more is appended until the log is reopened: %w", seq, l.stuck)
	}
	return fmt.Errorf("audit: entry %d not written; the log is back at entry %d: %w", seq, l.seq, err)
}

// undo truncates the file back to its last whole entry.
func (l *Log) undo() error {
	if err := l.file.Truncate(l.size); err != nil {
		return err
	}
	if _, err := l.file.Seek(l.size, io.SeekStart); err != nil {
		return err
	}
	return l.file.Sync()
}

// Close closes a file opened by Open.
func (l *Log) Close() error {
	if l.file == nil {
		return nil
	}
	return l.file.Close()
}

// VerifyResult is what Verify found in a chain that holds together, or
// in the part of it before a torn final line.
type VerifyResult struct {
	Entries uint64 `json:"entries"`
	// Head is the line hash of the last entry ("" for an empty log):
	// compare it with a copy kept elsewhere to detect a cut-off tail.
	Head  string    `json:"head"`
	First time.Time `json:"first,omitempty"`
	Last  time.Time `json:"last,omitempty"`
	// Bytes is the length of the entries verified, newlines included.
	Bytes int64 `json:"bytes"`
	// TornBytes and TornSHA256 describe a torn final line after them
	// (with ErrTornTail).
	TornBytes  int64  `json:"torn_bytes,omitempty"`
	TornSHA256 string `json:"torn_sha256,omitempty"`
}

// ErrBroken is wrapped by every verification failure that is evidence of
// tampering (or of damage other than a cut-short write); the error names
// the line and what is wrong with it.
var ErrBroken = errors.New("audit log does not verify")

// ErrTornTail is returned, instead of ErrBroken, when every whole line
// verifies and the log ends in bytes without a newline, no longer than an
// entry may be: what a write cut short by a crash leaves. The result
// covers the entries before it. Open moves such a tail into a file of its
// own and records that it did; it is not tamper evidence as such, though
// whoever can write the file could also cut entries off, which only a
// head kept elsewhere shows.
var ErrTornTail = errors.New("audit log ends in a torn write")

// Verify reads a whole chain and checks every link: each line is one
// entry of at most MaxLineSize, whose Hash matches its content, whose Prev
// is the hash of the line before and whose Seq follows the previous one.
func Verify(r io.Reader) (VerifyResult, error) {
	var res VerifyResult
	br := bufio.NewReaderSize(r, 64<<10)
	prevLine := ""
	for n := 1; ; n++ {
		line, err := readLine(br)
		var torn tornLine
		switch {
		case err == io.EOF:
			return res, nil
		case errors.As(err, &torn):
			sum := sha256.Sum256(torn)
			res.TornBytes, res.TornSHA256 = int64(len(torn)), hex.EncodeToString(sum[:])
			return res, fmt.Errorf("%w: line %d: %d bytes after entry %d end without a newline (a write cut short; Open moves them into a file of their own and records a log_recovered entry)",
				ErrTornTail, n, len(torn), res.Entries)
		case err != nil:
			return res, fmt.Errorf("%w: line %d: %w", ErrBroken, n, err)
		}
		var e Entry
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil || dec.More() {
			return res, fmt.Errorf("%w: line %d is not an audit entry: %v", ErrBroken, n, err)
		}
		want, err := contentHash(e)
		if err != nil || want != e.Hash {
			return res, fmt.Errorf("%w: line %d (seq %d) was edited: its content does not match its hash", ErrBroken, n, e.Seq)
		}
		// JSON decoding forgives key case and spacing; the chain links
		// lines by their bytes, so only the bytes Append writes are an
		// entry, and no line can be reworded without breaking its hash.
		if canon, err := json.Marshal(e); err != nil || !bytes.Equal(canon, line) {
			return res, fmt.Errorf("%w: line %d (seq %d) was edited: its bytes are not those its content encodes to", ErrBroken, n, e.Seq)
		}
		if e.Prev != prevLine || e.Seq != res.Entries+1 {
			return res, fmt.Errorf("%w: line %d (seq %d) does not follow line %d (seq %d): an entry before it was dropped, inserted or moved",
				ErrBroken, n, e.Seq, n-1, res.Entries)
		}
		res.Entries = e.Seq
		if n == 1 {
			res.First = e.Time
		}
		res.Last = e.Time
		prevLine = lineHash(line)
		res.Head = prevLine
		res.Bytes += int64(len(line)) + 1
	}
}

// tornLine is the last line of a log when it has no newline.
type tornLine []byte

func (tornLine) Error() string { return "ends without a newline" }

// readLine reads one newline-terminated line of at most MaxLineSize. A
// last line without its newline is returned as a tornLine error.
func readLine(br *bufio.Reader) ([]byte, error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		buf = append(buf, chunk...)
		if len(buf) > MaxLineSize {
			return nil, fmt.Errorf("longer than %d bytes", MaxLineSize)
		}
		switch {
		case err == nil:
			return bytes.TrimSuffix(buf, []byte("\n")), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF && len(buf) == 0:
			return nil, io.EOF
		case err == io.EOF:
			return nil, tornLine(buf)
		default:
			return nil, err
		}
	}
}

// ShortHash abbreviates a hash for display.
func ShortHash(h string) string {
	if len(h) > 16 {
		return h[:16]
	}
	return strings.ToLower(h)
}
