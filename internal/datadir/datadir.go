package datadir

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// LockName is the lock file's name inside a data directory.
const LockName = "trustbridge.lock"

// maxRecord bounds the holder record read from a lock file.
const maxRecord = 4 << 10

// Holder is who holds a data directory: the record its lock file keeps.
type Holder struct {
	PID     int       `json:"pid"`
	Host    string    `json:"host,omitempty"`
	Started time.Time `json:"started"`
	// Command names what holds the lock, e.g. "trustbridge server".
	Command string `json:"command,omitempty"`
}

// Self is the Holder record of this process running command.
func Self(command string) Holder {
	host, _ := os.Hostname()
	return Holder{PID: os.Getpid(), Host: host, Started: time.Now().UTC().Truncate(time.Second), Command: command}
}

// String names the holder for an error message or a log line.
func (h Holder) String() string {
	if h.PID <= 0 {
		return "a process that has not recorded itself in the lock file"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "pid %d", h.PID)
	if h.Host != "" {
		fmt.Fprintf(&b, " on host %s", h.Host)
	}
	if h.Command != "" {
		fmt.Fprintf(&b, " (%s)", h.Command)
	}
	if !h.Started.IsZero() {
		fmt.Fprintf(&b, ", started %s", h.Started.UTC().Format(time.RFC3339))
	}
	return b.String()
}

// ParseHolder reads a lock file's record. An empty file is the zero
// Holder: the last holder released the lock cleanly, or the current one
// has not written its record yet.
func ParseHolder(data []byte) (Holder, error) {
	var h Holder
	if len(bytes.TrimSpace(data)) == 0 {
		return h, nil
	}
	if len(data) > maxRecord {
		return h, fmt.Errorf("lock record of %d bytes exceeds %d", len(data), maxRecord)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return Holder{}, fmt.Errorf("lock record: %w", err)
	}
	if dec.More() {
		return Holder{}, errors.New("lock record: data after the record")
	}
	if h.PID < 0 {
		return Holder{}, fmt.Errorf("lock record: pid %d", h.PID)
	}
	return h, nil
}

// ErrHeld is wrapped by the error Acquire returns when another process
// holds the lock.
var ErrHeld = errors.New("data directory in use")

// HeldError says who holds a data directory another process tried to
// lock.
type HeldError struct {
	Dir    string
	Holder Holder
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("%s is in use by another trustbridge: %s holds its lock %s; two servers on one data directory would overwrite each other's audit log and CA state: stop that one first, or give this one a data directory of its own",
		e.Dir, e.Holder, filepath.Join(e.Dir, LockName))
}

// Unwrap makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Unwrap() error { return ErrHeld }

// Lock is a held data directory lock.
type Lock struct {
	f    *os.File
	path string
}

// Path is the lock file's path.
func (l *Lock) Path() string { return l.path }

// Release empties the record and releases the lock. The file stays:
// removing a lock file another process may have open would let two
// processes lock two different files of the same name.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	terr := l.f.Truncate(0)
	uerr := unlock(l.f)
	heldHere.forget(l.f)
	cerr := l.f.Close()
	l.f = nil
	return errors.Join(terr, uerr, cerr)
}

// Acquire takes the exclusive lock on dir, an existing directory, and
// records h in it. When another process holds the lock it returns a
// *HeldError naming that process.
func Acquire(dir string, h Holder) (*Lock, error) {
	return acquire(dir, h, acquireRetries, pause)
}

// acquireRetries bounds how often Acquire tries again when the lock is
// held by a process that has not recorded itself (Probe's brief shared
// lock, or a server between taking the lock and writing its record).
const acquireRetries = 50

func pause() { time.Sleep(10 * time.Millisecond) }

func acquire(dir string, h Holder, retries int, wait func()) (*Lock, error) {
	path := filepath.Join(dir, LockName)
	f, err := openLockFile(path)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	for try := 0; ; try++ {
		held, err := tryLock(f, true)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !held {
			break
		}
		other, _ := readHolder(f)
		if recorded(other, heldHere.holds(f)) {
			f.Close()
			return nil, &HeldError{Dir: dir, Holder: other}
		}
		if try >= retries {
			// The record is a dead holder's: whoever holds the lock has
			// not said who it is.
			f.Close()
			return nil, &HeldError{Dir: dir}
		}
		wait()
	}
	if err := writeHolder(f, h); err != nil {
		_ = unlock(f)
		f.Close()
		return nil, fmt.Errorf("lock %s: recording the holder: %w", path, err)
	}
	heldHere.add(f)
	return &Lock{f: f, path: path}, nil
}

// recorded says whether h names a live process: the holder of a held
// lock, as against a record left by a dead one. A record naming this
// process (pid and host) is live only if this process holds the lock
// (ours says whether it does): otherwise it is a crashed predecessor's
// that had the same pid, as pid 1 of a restarted container has, and the
// lock is held by someone who has not recorded itself yet (or a Probe).
func recorded(h Holder, ours bool) bool {
	if h.PID <= 0 {
		return false
	}
	host, _ := os.Hostname()
	if h.Host != "" && h.Host != host {
		return true // its liveness cannot be checked from here
	}
	if h.PID == os.Getpid() {
		return ours
	}
	return alive(h.PID)
}

// heldHere lists the lock files this process holds, so that a record
// naming this process can be told from a predecessor's. The kernel keeps
// the locks per process; this mirrors what it holds for this one.
var heldHere lockSet

type lockSet struct {
	mu    sync.Mutex
	files []*os.File
}

func (s *lockSet) add(f *os.File) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.files = append(s.files, f)
}

func (s *lockSet) forget(f *os.File) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, g := range s.files {
		if g == f {
			s.files = append(s.files[:i], s.files[i+1:]...)
			return
		}
	}
}

// holds says whether this process holds a lock on the file f is open on.
func (s *lockSet) holds(f *os.File) bool {
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.files {
		if gi, err := g.Stat(); err == nil && os.SameFile(fi, gi) {
			return true
		}
	}
	return false
}

func writeHolder(f *os.File, h Holder) error {
	data, err := json.Marshal(h)
	if err != nil {
		return err
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.WriteAt(append(data, '\n'), 0); err != nil {
		return err
	}
	return f.Sync()
}

func readHolder(f *os.File) (Holder, error) {
	data, err := io.ReadAll(io.NewSectionReader(f, 0, maxRecord+1))
	if err != nil {
		return Holder{}, err
	}
	return ParseHolder(data)
}

// LockFile takes an exclusive lock on an open file without waiting, for
// state a server keeps outside its data directory (an --audit-log
// elsewhere). Closing the file releases it. It returns an error wrapping
// ErrHeld when another open file holds the lock.
func LockFile(f *os.File) error {
	held, err := tryLock(f, true)
	if err != nil {
		return err
	}
	if held {
		return fmt.Errorf("%w: %s is locked by another process", ErrHeld, f.Name())
	}
	return nil
}

// Wait takes an advisory lock on the open file f, waiting for whoever
// holds it: exclusive for a writer, shared for a reader, for tools that
// take turns on state (ca rotate and ca issue on the CA directory, token
// appends on their file's directory) rather than refuse each other. The
// returned func releases the lock and closes f; on an error f is closed.
// Where flock is not available it excludes no one.
func Wait(f *os.File, exclusive bool) (func(), error) {
	if err := lockWait(f, exclusive); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		_ = unlock(f)
		_ = f.Close()
	}, nil
}

// Probe says whether a process holds dir's lock and, if so, who. It
// creates nothing: a directory without a lock file is not held. Where
// flock is not available it reports the record, held or not.
func Probe(dir string) (Holder, bool, error) {
	path := filepath.Join(dir, LockName)
	f, err := openForProbe(path)
	if errors.Is(err, os.ErrNotExist) {
		return Holder{}, false, nil
	}
	if err != nil {
		return Holder{}, false, fmt.Errorf("lock %s: %w", path, err)
	}
	defer f.Close()
	if !Supported {
		h, err := readHolder(f)
		return h, err == nil && h.PID > 0, err
	}
	held, err := tryLock(f, false)
	if err != nil {
		return Holder{}, false, fmt.Errorf("lock %s: %w", path, err)
	}
	if !held {
		return Holder{}, false, unlock(f)
	}
	h, err := readHolder(f)
	if err != nil {
		return Holder{}, true, fmt.Errorf("lock %s: %w", path, err)
	}
	return h, true, nil
}
