package ca

import (
	"errors"
	"fmt"
	"time"

	"github.com/trustbridge/trustbridge/ca/castate"
)

// PublishLead is how many refresh hints a new root is published before it
// signs. SPIFFE Federation §4.1 asks for 3 to 5; the top of the range gives
// peers that missed a poll or two time to catch up.
const PublishLead = 5

// maxRefreshHint bounds the published refresh hint: peers would not see a
// revocation for that long, and PublishLead of them must fit a root's life.
const maxRefreshHint = 30 * 24 * time.Hour

// timeline holds the parameters of root rotation.
type timeline struct {
	// RefreshHint is the spiffe_refresh_hint published with the bundle.
	RefreshHint time.Duration
	// MaxWorkloadTTL bounds every leaf the CA signs, so a retired root can
	// be removed MaxWorkloadTTL after it stopped signing.
	MaxWorkloadTTL time.Duration
}

// validate checks that a root of lifetime rootTTL leaves room for the whole
// timeline: published for PublishLead hints after its predecessor's half
// life, and still valid for MaxWorkloadTTL after it started signing.
func (tl timeline) validate(rootTTL time.Duration) error {
	switch {
	case tl.RefreshHint < time.Second || tl.RefreshHint > maxRefreshHint:
		return fmt.Errorf("refresh hint %s is outside 1s to %s", tl.RefreshHint, maxRefreshHint)
	case tl.MaxWorkloadTTL <= 0:
		return errors.New("maximum workload TTL must be positive")
	case rootTTL <= 0:
		return errors.New("root TTL must be positive")
	}
	if need := PublishLead*tl.RefreshHint + tl.MaxWorkloadTTL; rootTTL/2 < need {
		return fmt.Errorf("root TTL %s is too short: half of it must cover %d refresh hints (%s) plus the maximum workload TTL (%s), at least %s in all",
			rootTTL, PublishLead, PublishLead*tl.RefreshHint, tl.MaxWorkloadTTL, 2*need)
	}
	return nil
}

// rootTimes is what the rotation plan needs to know about one root.
type rootTimes struct {
	State      castate.RootState
	NotBefore  time.Time
	NotAfter   time.Time
	PreparedAt time.Time // when it entered the published bundle
	// MinActivateAt, when set, is a floor fixed at preparation time from
	// the refresh hint published then.
	MinActivateAt time.Time
	// PublishedAt is when a serving process published the root; zero
	// means it has not been served yet and cannot activate.
	PublishedAt time.Time
	// RemoveAfter is set when the root is retired: by then every
	// certificate it signed has expired.
	RemoveAfter time.Time
}

// step is one change the plan calls for.
type step int

// Steps the plan can call for.
const (
	stepNone      step = iota
	stepBootstrap      // no active root: create one and let it sign at once
	stepPrepare        // publish a successor to the active root
	stepActivate       // the prepared root signs; the active one retires
	stepRemove         // a retired root leaves the bundle
)

// prepareAt is when a successor to an active root is published: at half
// its lifetime.
func prepareAt(active rootTimes) time.Time {
	return active.NotBefore.Add(active.NotAfter.Sub(active.NotBefore) / 2)
}

// activateAt is the earliest a prepared root may sign: PublishLead refresh
// hints after it was published, by the current hint and by the one in
// force when it was prepared, whichever is later. A root not yet published
// (PublishedAt zero) never activates.
func (tl timeline) activateAt(prepared rootTimes) time.Time {
	if prepared.PublishedAt.IsZero() {
		return time.Time{}
	}
	at := prepared.PublishedAt.Add(PublishLead * tl.RefreshHint)
	if prepared.MinActivateAt.After(at) {
		return prepared.MinActivateAt
	}
	return at
}

// removeAfter is when a root retired at now can leave the bundle: every
// leaf it signed had a TTL of at most MaxWorkloadTTL and was clamped to
// the root's own expiry.
func (tl timeline) removeAfter(root rootTimes, now time.Time) time.Time {
	t := now.Add(tl.MaxWorkloadTTL)
	if root.NotAfter.Before(t) {
		return root.NotAfter
	}
	return t
}

// plan returns the next step due at now, the index of the root it applies
// to (-1 for bootstrap and prepare), and when the plan should be looked at
// again if nothing is due. It is a pure function of its inputs, so the
// scheduler and the tests agree on every instant.
//
// A retired root due to leave goes first. Then a prepared root waits out
// its publication lead and activates, even without an active root (a
// crash between retiring and activating cannot happen, but a hand-edited
// journal can); without either, a root is bootstrapped; and an active root
// has a successor prepared at half its life.
func (tl timeline) plan(now time.Time, roots []rootTimes) (due step, index int, next time.Time) {
	index, next = dueRemoval(now, roots)
	if index >= 0 {
		return stepRemove, index, time.Time{}
	}
	active, prepared := activeAndPrepared(roots)
	switch {
	case prepared >= 0:
		return tl.planActivation(now, roots[prepared], prepared, next)
	case active < 0:
		return stepBootstrap, -1, time.Time{}
	}
	if at := prepareAt(roots[active]); now.Before(at) {
		return stepNone, -1, earliest(next, at)
	}
	return stepPrepare, -1, time.Time{}
}

// dueRemoval is the first retired root due to leave the bundle at now (-1
// when none is), and the earliest removal still to come (zero when none).
func dueRemoval(now time.Time, roots []rootTimes) (index int, next time.Time) {
	for i, r := range roots {
		if r.State != castate.StateRetired {
			continue
		}
		if !now.Before(r.RemoveAfter) {
			return i, time.Time{}
		}
		next = earliest(next, r.RemoveAfter)
	}
	return -1, next
}

// activeAndPrepared are the indexes of the (last) active and prepared
// roots, -1 for none.
func activeAndPrepared(roots []rootTimes) (active, prepared int) {
	active, prepared = -1, -1
	for i, r := range roots {
		switch r.State {
		case castate.StateActive:
			active = i
		case castate.StatePrepared:
			prepared = i
		}
	}
	return active, prepared
}

// planActivation is the plan while root index is prepared: it activates
// once its publication lead is over; until then the plan waits for that
// (or for next, whichever comes first), and forever while it is not yet
// published.
func (tl timeline) planActivation(now time.Time, prepared rootTimes, index int, next time.Time) (step, int, time.Time) {
	at := tl.activateAt(prepared)
	switch {
	case at.IsZero():
		return stepNone, -1, next
	case now.Before(at):
		return stepNone, -1, earliest(next, at)
	}
	return stepActivate, index, time.Time{}
}
