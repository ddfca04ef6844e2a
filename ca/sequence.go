package ca

import (
	"fmt"
	"time"
)

// The published spiffe_sequence never goes back, even across a restore of
// an old backup of the state or a move to another backend, where the
// counter in the state restarts from whatever the copy held. Two rules
// make it so:
//
//  1. Every change moves the sequence to nextSequence: one more than
//     before, and never below the current Unix time in seconds. Anything
//     published at time t therefore has a sequence of at least t, and
//     exceeds t only by the changes made in the same second.
//  2. The first time a process writes the state (the leader, with several
//     replicas), it publishes a new sequence even when nothing else
//     changed. A process cannot tell a restored copy from the state it
//     wrote itself before a restart, so it treats every start as a
//     possible restore: the restored counter, whatever it was, is moved
//     past the start time, and so past everything published before the
//     restore (which happened earlier). A plain restart costs peers one
//     refetch of the same keys under a higher sequence, which every
//     consumer takes as a normal update (trustbridge's federation.Accept;
//     SPIRE's bundle client stores any document that differs from the one
//     it holds).
//
// Rule 1 keeps the "+1 per change" semantics peers rely on, so a clock
// that goes back never makes the sequence go back; rule 2 needs the clock
// to be no further behind at the restart than it was ahead when the
// newest sequence was published. A clock that was far ahead once (and
// published sequences from the future) is the one case the rule cannot
// cover on its own: RaiseSequence moves a restored state past a sequence
// the operator reads from a peer.

// nextSequence is the sequence published after prev at now:
// max(prev+1, now in Unix seconds).
func nextSequence(prev uint64, now time.Time) uint64 {
	next := prev + 1
	if next == 0 { // prev was the largest uint64: stay there, never wrap to 0
		next = prev
	}
	if s := now.Unix(); s > 0 && uint64(s) > next {
		return uint64(s)
	}
	return next
}

// maxRaise is the largest sequence RaiseSequence moves past: 2^53, above
// which many JSON parsers lose integer precision, and which no clock
// reaches (it is 285 million years in Unix seconds). A larger one is a
// typo; moving to it would leave no room for the +1 of later changes.
const maxRaise = 1 << 53

// RaiseSequence moves the sequence of the CA state in dataDir above
// above (to above+1), never down, and returns the sequence the state holds
// now. It is for the one case the rules above do not cover: peers hold a
// sequence from a clock that once ran ahead. Peers refuse the same
// sequence with other keys (a sequence conflict) as they refuse a lower
// one, so the state must go past what they hold, not to it. A running
// server publishes the raised sequence at its next check; the next start
// publishes one more.
func RaiseSequence(dataDir string, above uint64) (uint64, error) {
	if above >= maxRaise {
		return 0, fmt.Errorf("ca: sequence %d is beyond what any clock published (at most %d)", above, uint64(maxRaise-1))
	}
	s := NewStore(dataDir)
	unlock, err := s.lockExisting()
	if err != nil {
		return 0, err
	}
	defer unlock()
	j, _, err := s.Load("")
	if err != nil {
		return 0, err
	}
	if j == nil {
		return 0, fmt.Errorf("ca: no CA state in %s", s.Dir())
	}
	if j.Sequence > above {
		return j.Sequence, nil
	}
	j.Sequence = above + 1
	if err := s.saveJournal(j); err != nil {
		return 0, err
	}
	return j.Sequence, nil
}
