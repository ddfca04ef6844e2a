package ca

import (
	"crypto"
	"crypto/x509"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"k8s.io/utils/clock"
)

// signingSnapshot is what the manager published for signing, read by the
// signer without a lock. It is immutable once published: it shares no
// mutable value with the manager's state, which changes roots and keys in
// place.
type signingSnapshot struct {
	gen uint64 // the board's generation once this snapshot is published

	// material signs X509-SVIDs, serving certificates and downstream
	// intermediates; its Cert is nil when there is nothing to sign with,
	// and the manager says why (manager.noMaterial).
	material SigningMaterial
	policy   Policy
	bundle   *spiffebundle.Bundle
	// issuers are the signing certificates whose key is ours (IssuedHere);
	// pluginSigners those a plug-in directory replaced, each until when
	// leaves it signed may be valid.
	issuers       []*x509.Certificate
	pluginSigners []pluginSigner

	jwtKey *jwtSigningKey // the active JWT key, nil when none
	// noJWTKey is why there is no active JWT key, when there is none.
	noJWTKey      error
	maxJWTSVIDTTL time.Duration
}

// jwtSigningKey is the active JWT key, copied out of the state.
type jwtSigningKey struct {
	kid      string
	key      crypto.Signer
	notAfter time.Time
}

// board is where the manager publishes signing snapshots and the signer
// reads them. A change runs between begin and end; gen is odd while one
// runs and moves on at each end, so a reader that sees the gen of the
// snapshot it holds knows no change has begun since it was published.
//
// Why a reader needs more than the pointer: a leaf's validity comes from
// the time signing reads, and a retirement computes the retired root's
// RemoveAfter from the time it reads. A signing whose time were read
// after a retirement's, with the root that retirement retired, could
// outlive RemoveAfter. read therefore takes the time between loading a
// snapshot and checking that no change began since (the lock-free path),
// or, when one did, under the gate's read lock, which waits for the change
// to end: every signing's time is before a change's decision or after its
// result is published, as it was when signing held the state's read lock.
type board struct {
	gate sync.RWMutex // held for writing by a change, begin to end
	gen  atomic.Uint64
	cur  atomic.Pointer[signingSnapshot]
}

func newBoard(first *signingSnapshot) *board {
	b := &board{}
	b.cur.Store(first)
	return b
}

// begin starts a change: readers wait for its end.
func (b *board) begin() {
	b.gate.Lock()
	b.gen.Add(1)
}

// end publishes s, the state the change left, and ends the change.
func (b *board) end(s *signingSnapshot) {
	s.gen = b.gen.Load() + 1
	b.cur.Store(s)
	b.gen.Add(1)
	b.gate.Unlock()
}

// load returns the current snapshot; a change under way is waited for, so
// a subscriber it signalled reads what it published.
func (b *board) load() *signingSnapshot {
	s, _ := b.read(nil)
	return s
}

// read returns the current snapshot and, with clk, the time to sign at:
// no change that began after the snapshot's publication read its own time
// before this one (see board).
func (b *board) read(clk clock.PassiveClock) (*signingSnapshot, time.Time) {
	s := b.cur.Load()
	var now time.Time
	if clk != nil {
		now = clk.Now()
	}
	if b.gen.Load() == s.gen {
		return s, now
	}
	b.gate.RLock()
	defer b.gate.RUnlock()
	s = b.cur.Load()
	if clk != nil {
		now = clk.Now()
	}
	return s, now
}
