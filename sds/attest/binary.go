package attest

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds of binary attestation (Config.Binary). Any local user can open
// the agent's sockets, and each call would otherwise read a whole binary.
const (
	// maxConcurrentHashes bounds the binaries hashed at once; more
	// attestations wait for a slot.
	maxConcurrentHashes = 2
	// maxDigests bounds the digests kept.
	maxDigests = 1024
	// racyWindow: a file whose ctime is this recent is hashed every time
	// and never cached. File times come from a coarse clock (a jiffy), so
	// a rewrite right after a write can leave size and times unchanged;
	// a rewrite later always moves ctime, which no process can set.
	racyWindow = 2 * time.Second
)

// fileID names a file by device and inode.
type fileID struct{ dev, ino uint64 }

// fileKey names one version of a file: a write changes its size or
// times, and its ctime no process can set.
type fileKey struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64 // nanoseconds
}

// digestCache keeps the SHA-256 of the binaries attested lately, by
// fileKey, so a process connecting again costs an fstat, not a read of its
// binary, and bounds the reads running at once.
type digestCache struct {
	slots chan struct{}
	now   func() time.Time
	// hashed counts the binaries read (tests).
	hashed atomic.Int64

	mu   sync.Mutex
	sums map[fileKey]string
}

func newDigestCache() *digestCache {
	return &digestCache{slots: make(chan struct{}, maxConcurrentHashes), now: time.Now, sums: make(map[fileKey]string)}
}

// binary returns the path and SHA-256 of c's executable, read through
// /proc/<pid>/exe: the file the process runs, even if it was replaced or
// deleted on disk or lives in another mount namespace. It must be the
// one the process ran when it connected: a process that connected and
// then exec'ed a binary some rule selects keeps the connection, but not
// the rule.
func (a *Attestor) binary(c *Caller) (string, string, error) {
	pid := c.PID
	exe := a.procPath(pid, "exe")
	path, err := os.Readlink(exe)
	if err != nil {
		return "", "", refusal(ErrBinary, "pid %d: %w", pid, err)
	}
	file, err := os.Open(exe)
	if err != nil {
		return "", "", refusal(ErrBinary, "pid %d: %w", pid, err)
	}
	defer file.Close()
	st, err := file.Stat()
	if err != nil {
		return "", "", refusal(ErrBinary, "pid %d: %w", pid, err)
	}
	if st.Size() > a.cfg.MaxBinarySize {
		return "", "", refusal(ErrBinary, "pid %d: %s is over %d bytes", pid, path, a.cfg.MaxBinarySize)
	}
	if id, ok := idOf(st); !ok || id != c.exe {
		return "", "", refusal(ErrBinary, "pid %d runs %s, not the executable it connected with: it exec'ed since", pid, path)
	}
	key, keyed := keyOf(st)
	keyed = keyed && a.digests.now().Sub(time.Unix(0, key.ctime)) >= racyWindow
	if keyed {
		if sum, ok := a.digests.get(key); ok {
			return path, sum, nil
		}
	}
	sum, err := a.digests.hash(file, a.cfg.MaxBinarySize)
	if err != nil {
		return "", "", refusal(ErrBinary, "pid %d: reading %s: %w", pid, path, err)
	}
	if keyed {
		a.digests.put(key, sum)
	}
	return path, sum, nil
}

func (d *digestCache) get(k fileKey) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sum, ok := d.sums[k]
	return sum, ok
}

func (d *digestCache) put(k fileKey, sum string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.sums) >= maxDigests {
		clear(d.sums)
	}
	d.sums[k] = sum
}

// errTooLarge is a binary that grew past the bound while it was read.
type errTooLarge int64

func (e errTooLarge) Error() string { return "over the size bound while read" }

// hash reads f whole, at most max bytes, in one of the slots.
func (d *digestCache) hash(f *os.File, max int64) (string, error) {
	d.slots <- struct{}{}
	defer func() { <-d.slots }()
	d.hashed.Add(1)
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(f, max+1))
	if err != nil {
		return "", err
	}
	if n > max {
		return "", errTooLarge(max)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
