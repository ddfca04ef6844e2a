package fence

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrNotLeader: this replica does not lead, so it does not write.
var ErrNotLeader = errors.New("not the leader")

// Leader says whether this replica leads (leader.Elector does).
type Leader interface{ IsLeader() bool }

// leaseBound is the optional part of a Leader that says until when it
// counts itself the leader (leader.Elector has it).
type leaseBound interface{ LeadingUntil() time.Time }

// Writer fences writes of shared state by leadership.
type Writer struct {
	// Leader fences writes; nil means always the leader (a single
	// replica). If it also has LeadingUntil() time.Time, a write still
	// under way at that instant is abandoned.
	Leader Leader
	// Timeout bounds each write.
	Timeout time.Duration
}

// Check refuses, with ErrNotLeader, while Leader does not lead; verb says
// what is refused ("write", "delete"). Writers call it before preparing
// what they write.
func (w Writer) Check(verb string) error {
	if w.Leader != nil && !w.Leader.IsLeader() {
		return fmt.Errorf("%w: refusing to %s", ErrNotLeader, verb)
	}
	return nil
}

// Write calls write, after Check, with a context whose deadline is
// Timeout or, if sooner, when Leader stops counting itself the leader. It
// refuses with ErrNotLeader when that instant has passed already. If write
// fails at or after it, the request may have gone out past the instant
// another replica may lead: abandoned, as far as this replica can, and
// reported as ErrNotLeader with write's error in the message. Otherwise
// write's error is returned as is.
func (w Writer) Write(write func(ctx context.Context) error) error {
	if err := w.Check("write"); err != nil {
		return err
	}
	deadline := time.Now().Add(w.Timeout)
	var until time.Time
	lb, bounded := w.Leader.(leaseBound)
	if bounded {
		if until = lb.LeadingUntil(); until.IsZero() {
			return fmt.Errorf("%w: refusing to write", ErrNotLeader)
		}
		if until.Before(deadline) {
			deadline = until
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	err := write(ctx)
	if err != nil && bounded && !time.Now().Before(until) {
		return fmt.Errorf("%w: leadership may have lapsed during the write: %v", ErrNotLeader, err)
	}
	return err
}
