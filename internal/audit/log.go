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
// Findings judges a trustview.Snapshot by the rules `trustbridge audit`
// applies: authorities near expiry, weak keys and signatures, non-CA
// certificates in bundles, stale federation, sequence regressions, a root
// trusted for two trust domains, endpoints that are not https or that
// served the other federation profile.
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
	"os"
	"strings"
	"sync"
	"time"
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
	// root_loaded, bundle_accepted, bundle_rejected, endpoint_added,
	// endpoint_changed, endpoint_removed, baseline.
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

// Log appends entries to a chain. It is safe for concurrent use.
type Log struct {
	mu   sync.Mutex
	w    io.Writer
	file *os.File // nil for a plain writer
	seq  uint64
	head string // line hash of the last entry
	now  func() time.Time
}

// New starts a new chain on w (standard output, say).
func New(w io.Writer) *Log {
	return &Log{w: w, now: time.Now}
}

// Open appends to the chain in the file at path, creating it (mode 0600)
// when missing. An existing file is verified first: a chain that does not
// verify is never appended to, since an entry after a tampered one would
// seem to vouch for it; Open fails and says to move the file aside.
func Open(path string) (*Log, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
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
	res, err := Verify(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("audit: %s does not verify, so nothing is appended to it (move it aside to start a new chain; keep it as evidence): %w", path, err)
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		f.Close()
		return nil, fmt.Errorf("audit: %w", err)
	}
	return &Log{w: f, file: f, seq: res.Entries, head: res.Head, now: time.Now}, nil
}

// Head is the line hash of the newest entry and the number of entries.
func (l *Log) Head() (string, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.head, l.seq
}

// Append sets e's Seq, Time (when zero), Prev and Hash, writes it as one
// line, and syncs a file to disk before returning.
func (l *Log) Append(e Entry) error {
	l.mu.Lock()
	defer l.mu.Unlock()
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
	if _, err := l.w.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	if l.file != nil {
		if err := l.file.Sync(); err != nil {
			return fmt.Errorf("audit: %w", err)
		}
	}
	l.seq, l.head = e.Seq, lineHash(line)
	return nil
}

// Close closes a file opened by Open.
func (l *Log) Close() error {
	if l.file == nil {
		return nil
	}
	return l.file.Close()
}

// VerifyResult is what Verify found in a chain that holds together.
type VerifyResult struct {
	Entries uint64 `json:"entries"`
	// Head is the line hash of the last entry ("" for an empty log):
	// compare it with a copy kept elsewhere to detect a cut-off tail.
	Head  string    `json:"head"`
	First time.Time `json:"first,omitempty"`
	Last  time.Time `json:"last,omitempty"`
}

// ErrBroken is wrapped by every verification failure; the error names the
// line and what is wrong with it.
var ErrBroken = errors.New("audit log does not verify")

// Verify reads a whole chain and checks every link: each line is one
// entry of at most MaxLineSize, whose Hash matches its content, whose Prev
// is the hash of the line before and whose Seq follows the previous one.
func Verify(r io.Reader) (VerifyResult, error) {
	var res VerifyResult
	br := bufio.NewReaderSize(r, 64<<10)
	prevLine := ""
	for n := 1; ; n++ {
		line, err := readLine(br)
		if err == io.EOF {
			return res, nil
		}
		if err != nil {
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
	}
}

// readLine reads one newline-terminated line of at most MaxLineSize. A
// last line without its newline is a torn write.
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
			return nil, errors.New("ends without a newline (a torn or truncated write)")
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
