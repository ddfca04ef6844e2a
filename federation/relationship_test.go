package federation

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// relFixture is the bundles a relationship's table tests serve: b7 is the
// published bundle (sequence 7, refresh hint 5m), the others its variants.
type relFixture struct {
	ep        Endpoint
	bootstrap *spiffebundle.Bundle
	b7        *spiffebundle.Bundle
	t0        time.Time
}

func newRelFixture(t *testing.T) *relFixture {
	fx := newFetchFixture(t)
	ep := web(t, fetchTD, "https://example.org/bundle")
	ep.BootstrapBundle = fx.ca.Bundle()
	return &relFixture{ep: ep, bootstrap: ep.BootstrapBundle, b7: fx.bundle,
		t0: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
}

// variant is b with sequence seq (none when seq < 0) and refresh hint
// hint (none when hint < 0).
func variant(b *spiffebundle.Bundle, seq int64, hint time.Duration) *spiffebundle.Bundle {
	c := b.Clone()
	if seq >= 0 {
		c.SetSequenceNumber(uint64(seq))
	} else {
		c.ClearSequenceNumber()
	}
	if hint >= 0 {
		c.SetRefreshHint(hint)
	} else {
		c.ClearRefreshHint()
	}
	return c
}

// relationship returns a relationship of f.ep that last succeeded at
// lastSuccess (none when zero) holding held (none when nil), after
// failures failed polls (never polled when neither); its state is the one
// it was last logged in.
func (f *relFixture) relationship(held *spiffebundle.Bundle, lastSuccess time.Time, failures int, allowEmpty bool) *relationship {
	r := newRelationship(f.ep, RefreshPolicy{Min: DefaultMinRefresh, Max: DefaultMaxRefresh}, allowEmpty)
	r.held = held
	if !lastSuccess.IsZero() || failures > 0 {
		r.lastAttempt, r.firstAttempt = f.t0.Add(-time.Second), f.t0.Add(-time.Duration(failures+1)*time.Second)
	}
	r.lastSuccess, r.failures = lastSuccess, failures
	if failures > 0 {
		r.lastErr = errors.New("earlier failure")
	}
	r.savedAt = lastSuccess
	r.state = r.stateAt(f.t0.Add(-time.Second))
	return r
}

// TestRelationshipPolled is one trust domain's state machine: from a given
// state, one poll's outcome (a fetched document or a failure) decides what
// is held, what the store and the audit log hear, the state, and when the
// next poll is. The poll starts at t0 and ends a second later; no jitter.
func TestRelationshipPolled(t *testing.T) {
	f := newRelFixture(t)
	other := testca.New(t, fetchTD).Bundle()
	refused := errors.New("dial tcp 192.0.2.1:443: connect: connection refused")
	empty := spiffebundle.New(f.ep.TrustDomain)
	empty.SetSequenceNumber(8)
	ok := func(b *spiffebundle.Bundle) *FetchResult { return &FetchResult{Bundle: b, ETag: `"new"`} }

	type want struct {
		err       error  // errors.Is the poll's error; nil: success
		kind      string // fetches_total label
		held      *spiffebundle.Bundle
		accepted  bool      // the store must take held
		event     EventKind // "" for none
		reason    string    // the event's
		added     int       // authorities the event names as added
		removed   int
		save      bool
		from, to  State
		failures  int
		next      time.Duration // after the poll ended
		etag      string
		reasonLog string // in the transition's reason, when from != to
	}
	tests := []struct {
		name string
		r    func() *relationship
		res  *FetchResult
		err  error
		want want
	}{
		{
			name: "first fetch ok",
			r:    func() *relationship { return f.relationship(nil, time.Time{}, 0, false) },
			res:  ok(f.b7),
			want: want{kind: "ok", held: f.b7, accepted: true, event: EventBundleAccepted, added: 1, save: true,
				from: StatePending, to: StateOK, next: 5 * time.Minute, etag: `"new"`, reasonLog: "bundle fetched (sequence 7)"},
		},
		{
			name: "first fetch failed, nothing held: still pending, retried after MinRetry",
			r:    func() *relationship { return f.relationship(nil, time.Time{}, 0, false) },
			err:  refused,
			want: want{err: refused, kind: "transport", from: StatePending, to: StatePending, failures: 1, next: MinRetry},
		},
		{
			name: "second failure, nothing held: still pending",
			r:    func() *relationship { return f.relationship(nil, time.Time{}, 1, false) },
			err:  refused,
			want: want{err: refused, kind: "transport", from: StatePending, to: StatePending, failures: 2, next: 2 * time.Second},
		},
		{
			name: "third failure, nothing held: never answered, failing",
			r:    func() *relationship { return f.relationship(nil, time.Time{}, 2, false) },
			err:  refused,
			want: want{err: refused, kind: "transport", from: StatePending, to: StateFailing, failures: 3, next: 4 * time.Second,
				reasonLog: "the endpoint never served a bundle: 3 failed polls"},
		},
		{
			name: "first fetch after never answering: ok",
			r:    func() *relationship { return f.relationship(nil, time.Time{}, 5, false) },
			res:  ok(f.b7),
			want: want{kind: "ok", held: f.b7, accepted: true, event: EventBundleAccepted, added: 1, save: true,
				from: StateFailing, to: StateOK, next: 5 * time.Minute, etag: `"new"`},
		},
		{
			name: "first fetch failed with the bootstrap bundle held: failing",
			r:    func() *relationship { return f.relationship(f.bootstrap, time.Time{}, 0, false) },
			err:  refused,
			want: want{err: refused, kind: "transport", held: f.bootstrap, from: StatePending, to: StateFailing,
				failures: 1, next: MinRetry, reasonLog: "connection refused"},
		},
		{
			name: "first fetch replaces the bootstrap bundle",
			r:    func() *relationship { return f.relationship(f.bootstrap, time.Time{}, 0, false) },
			res:  ok(f.b7),
			want: want{kind: "ok", held: f.b7, accepted: true, event: EventBundleAccepted, save: true,
				from: StatePending, to: StateOK, next: 5 * time.Minute, etag: `"new"`},
		},
		{
			name: "refresh hint honoured",
			r:    func() *relationship { return f.relationship(nil, time.Time{}, 0, false) },
			res:  ok(variant(f.b7, 7, 2*time.Minute)),
			want: want{kind: "ok", accepted: true, event: EventBundleAccepted, added: 1, save: true,
				from: StatePending, to: StateOK, next: 2 * time.Minute, etag: `"new"`},
		},
		{
			name: "refresh hint below the minimum: the minimum",
			r:    func() *relationship { return f.relationship(nil, time.Time{}, 0, false) },
			res:  ok(variant(f.b7, 7, 5*time.Second)),
			want: want{kind: "ok", accepted: true, event: EventBundleAccepted, added: 1, save: true,
				from: StatePending, to: StateOK, next: DefaultMinRefresh, etag: `"new"`},
		},
		{
			name: "no refresh hint: the default interval",
			r:    func() *relationship { return f.relationship(nil, time.Time{}, 0, false) },
			res:  ok(variant(f.b7, 7, -1)),
			want: want{kind: "ok", accepted: true, event: EventBundleAccepted, added: 1, save: true,
				from: StatePending, to: StateOK, next: DefaultRefresh, etag: `"new"`},
		},
		{
			name: "third failure in a row: backoff doubles",
			r:    func() *relationship { return f.relationship(f.b7, f.t0.Add(-time.Minute), 2, false) },
			err:  refused,
			want: want{err: refused, kind: "transport", held: f.b7, from: StateFailing, to: StateFailing, failures: 3, next: 4 * time.Second},
		},
		{
			name: "backoff never beyond the refresh interval",
			r:    func() *relationship { return f.relationship(f.b7, f.t0.Add(-time.Minute), 40, false) },
			err:  refused,
			want: want{err: refused, kind: "transport", held: f.b7, from: StateFailing, to: StateFailing, failures: 41, next: 5 * time.Minute},
		},
		{
			name: "sequence going backwards: refused, last good kept",
			r:    func() *relationship { return f.relationship(f.b7, f.t0.Add(-time.Minute), 0, false) },
			res:  ok(variant(f.b7, 6, 5*time.Minute)),
			want: want{err: ErrSequenceRegression, kind: "sequence_regression", held: f.b7, event: EventBundleRejected,
				reason: "sequence_regression", from: StateOK, to: StateFailing, failures: 1, next: MinRetry, reasonLog: "spiffe_sequence regressed"},
		},
		{
			name: "same sequence, other keys: refused",
			r:    func() *relationship { return f.relationship(f.b7, f.t0.Add(-time.Minute), 0, false) },
			res:  ok(variant(other, 7, 5*time.Minute)),
			want: want{err: ErrSequenceConflict, kind: "sequence_conflict", held: f.b7, event: EventBundleRejected,
				reason: "sequence_conflict", from: StateOK, to: StateFailing, failures: 1, next: MinRetry},
		},
		{
			name: "keys: [] refused",
			r:    func() *relationship { return f.relationship(f.b7, f.t0.Add(-time.Minute), 0, false) },
			res:  ok(empty),
			want: want{err: ErrEmptyBundle, kind: "empty_bundle", held: f.b7, event: EventBundleRejected,
				reason: "empty_bundle", from: StateOK, to: StateFailing, failures: 1, next: MinRetry},
		},
		{
			name: "keys: [] applied when allowed",
			r:    func() *relationship { return f.relationship(f.b7, f.t0.Add(-time.Minute), 0, true) },
			res:  ok(empty),
			want: want{kind: "ok", held: empty, accepted: true, event: EventBundleAccepted, removed: 1, save: true,
				from: StateOK, to: StateOK, next: DefaultRefresh, etag: `"new"`},
		},
		{
			name: "roots of another trust domain: refused",
			r:    func() *relationship { return f.relationship(f.b7, f.t0.Add(-time.Minute), 0, false) },
			res: &FetchResult{Bundle: variant(f.b7, 8, 5*time.Minute), Warnings: []bundledoc.Warning{
				{Index: 0, Code: bundledoc.CodeForeignTrustDomain, Message: `names trust domain "other.org"`}}},
			want: want{err: ErrTrustDomainMismatch, kind: "trust_domain_mismatch", held: f.b7, event: EventBundleRejected,
				reason: "trust_domain_mismatch", from: StateOK, to: StateFailing, failures: 1, next: MinRetry},
		},
		{
			name: "rotation: a new sequence with new keys is taken",
			r:    func() *relationship { return f.relationship(f.b7, f.t0.Add(-time.Minute), 0, false) },
			res:  ok(variant(other, 8, 5*time.Minute)),
			want: want{kind: "ok", accepted: true, event: EventBundleAccepted, added: 1, removed: 1, save: true,
				from: StateOK, to: StateOK, next: 5 * time.Minute, etag: `"new"`},
		},
		{
			name: "publisher dropped spiffe_sequence: content decides, taken",
			r:    func() *relationship { return f.relationship(f.b7, f.t0.Add(-time.Minute), 0, false) },
			res:  ok(variant(f.b7, -1, 5*time.Minute)),
			want: want{kind: "ok", accepted: true, event: EventBundleAccepted, save: true,
				from: StateOK, to: StateOK, next: 5 * time.Minute, etag: `"new"`},
		},
		{
			name: "the held bundle again, saved less than half an interval ago: confirmed, not saved",
			r:    func() *relationship { return f.relationship(f.b7, f.t0.Add(-time.Minute), 0, false) },
			res:  ok(f.b7.Clone()),
			want: want{kind: "ok", held: f.b7, from: StateOK, to: StateOK, next: 5 * time.Minute, etag: `"new"`},
		},
		{
			name: "the held bundle again, saved half an interval ago: its fetch time is saved",
			r:    func() *relationship { return f.relationship(f.b7, f.t0.Add(-3*time.Minute), 0, false) },
			res:  ok(f.b7.Clone()),
			want: want{kind: "ok", held: f.b7, save: true, from: StateOK, to: StateOK, next: 5 * time.Minute, etag: `"new"`},
		},
		{
			name: "304 Not Modified confirms the held bundle",
			r: func() *relationship {
				r := f.relationship(f.b7, f.t0.Add(-3*time.Minute), 0, false)
				r.etag = `"v7"`
				return r
			},
			res:  &FetchResult{NotModified: true, ETag: `"v7"`},
			want: want{kind: "ok", held: f.b7, save: true, from: StateOK, to: StateOK, next: 5 * time.Minute, etag: `"v7"`},
		},
		{
			name: "a restored bundle served again is taken as fetched",
			r: func() *relationship {
				r := f.relationship(f.b7, f.t0.Add(-time.Minute), 0, false)
				r.fromLKG = true
				return r
			},
			res: ok(f.b7.Clone()),
			want: want{kind: "ok", accepted: true, event: EventBundleAccepted, save: true,
				from: StateOK, to: StateOK, next: 5 * time.Minute, etag: `"new"`},
		},
		{
			name: "no success for three refresh intervals: stale",
			r:    func() *relationship { return f.relationship(f.b7, f.t0.Add(-15*time.Minute), 0, false) },
			err:  refused,
			want: want{err: refused, kind: "transport", held: f.b7, from: StateOK, to: StateStale, failures: 1, next: MinRetry,
				reasonLog: "no successful poll for 3 refresh intervals"},
		},
		{
			name: "no success yet after three failures: stale",
			r:    func() *relationship { return f.relationship(f.bootstrap, time.Time{}, 2, false) },
			err:  refused,
			want: want{err: refused, kind: "transport", held: f.bootstrap, from: StateFailing, to: StateStale,
				failures: 3, next: 4 * time.Second, reasonLog: "no successful poll yet after 3 failures"},
		},
		{
			name: "recovery after failures",
			r:    func() *relationship { return f.relationship(f.b7, f.t0.Add(-time.Minute), 4, false) },
			res:  ok(variant(f.b7, 8, 5*time.Minute)),
			want: want{kind: "ok", accepted: true, event: EventBundleAccepted, save: true,
				from: StateFailing, to: StateOK, next: 5 * time.Minute, etag: `"new"`, reasonLog: "bundle fetched (sequence 8)"},
		},
		{
			name: "a poll already running is a failure of its own kind",
			r:    func() *relationship { return f.relationship(f.b7, f.t0.Add(-time.Minute), 0, false) },
			err:  fmt.Errorf("federation: %w", ErrPollInProgress),
			want: want{err: ErrPollInProgress, kind: "in_progress", held: f.b7, from: StateOK, to: StateFailing, failures: 1, next: MinRetry},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.r()
			old := r.held
			start, end := f.t0, f.t0.Add(time.Second)
			out := r.polled(start, end, tt.res, tt.err, 0.5)
			w := tt.want

			if w.err != nil {
				require.ErrorIs(t, out.err, w.err)
			} else {
				require.NoError(t, out.err)
			}
			assert.Equal(t, w.kind, out.kind)
			assert.Same(t, old, out.old)
			if w.held != nil {
				assert.Same(t, w.held, r.held, "held")
			} else if w.accepted {
				assert.Same(t, tt.res.Bundle, r.held, "held")
			} else {
				assert.Nil(t, r.held, "held")
			}
			assert.Equal(t, w.accepted, out.accepted, "accepted")
			if w.event == "" {
				assert.Nil(t, out.event, "event")
			} else if assert.NotNil(t, out.event, "event") {
				assert.Equal(t, w.event, out.event.Kind)
				assert.Equal(t, w.reason, out.event.Reason)
				assert.Equal(t, SequenceOf(old), out.event.OldSequence)
				assert.Equal(t, SequenceOf(tt.res.Bundle), out.event.NewSequence)
				assert.Len(t, out.event.Added, w.added)
				assert.Len(t, out.event.Removed, w.removed)
			}
			if w.save {
				if assert.NotNil(t, out.save, "save") {
					assert.Same(t, r.held, out.save.Bundle)
					assert.Equal(t, end, out.save.FetchedAt)
					assert.Equal(t, w.etag, out.save.ETag)
					assert.Equal(t, f.ep.URL.String(), out.save.EndpointURL)
					assert.Equal(t, end, r.savedAt)
				}
			} else {
				assert.Nil(t, out.save, "save")
			}
			assert.Equal(t, w.from, out.from, "from")
			assert.Equal(t, w.to, out.to, "to")
			assert.Equal(t, w.to, r.state, "state logged")
			assert.Equal(t, w.to, r.status(end).State, "status")
			assert.Equal(t, w.failures, r.failures, "failures")
			assert.Equal(t, start, r.lastAttempt)
			assert.Equal(t, end.Add(w.next), r.next, "next poll")
			assert.Equal(t, w.etag, r.etag, "entity tag")
			if out.err != nil {
				assert.Equal(t, out.err, r.lastErr)
				assert.Equal(t, uint64(1), r.refusals[w.kind])
			} else {
				assert.NoError(t, r.lastErr)
				assert.Equal(t, end, r.lastSuccess)
				assert.False(t, r.fromLKG)
			}
			if w.reasonLog != "" {
				assert.Contains(t, r.transitionReason(out.to), w.reasonLog)
			}
		})
	}
}

// TestRelationshipRestore: a stored bundle replaces what is held unless
// that is newer or the same; trust never goes backwards.
func TestRelationshipRestore(t *testing.T) {
	f := newRelFixture(t)
	other := testca.New(t, fetchTD).Bundle()
	now := f.t0
	stored := func(b *spiffebundle.Bundle, fetchedAt time.Time, url string) *LKGEntry {
		return &LKGEntry{TrustDomain: f.ep.TrustDomain, Bundle: b, ETag: `"s"`, EndpointURL: url, FetchedAt: fetchedAt}
	}
	url := f.ep.URL.String()
	tests := []struct {
		name        string
		held        *spiffebundle.Bundle
		lastSuccess time.Time
		e           *LKGEntry
		took        bool
		err         error
		held2       *spiffebundle.Bundle // held after; nil: e's bundle when took, else held
		lastSucc2   time.Time
		etag        string
	}{
		{name: "nothing held", e: stored(f.b7, now.Add(-time.Hour), url), took: true,
			lastSucc2: now.Add(-time.Hour), etag: `"s"`},
		{name: "the bootstrap bundle is superseded", held: f.bootstrap, e: stored(f.b7, now.Add(-time.Hour), url), took: true,
			lastSucc2: now.Add(-time.Hour), etag: `"s"`},
		{name: "stored for another URL: its entity tag is dropped", e: stored(f.b7, now.Add(-time.Hour), "https://old.example.org/"), took: true,
			lastSucc2: now.Add(-time.Hour)},
		{name: "stored a little in the future: now", e: stored(f.b7, now.Add(time.Minute), url), took: true,
			lastSucc2: now, etag: `"s"`},
		{name: "stored far in the future: no success", e: stored(f.b7, now.Add(time.Hour), url), took: true, etag: `"s"`},
		{name: "a newer one held: kept", held: variant(f.b7, 8, 5*time.Minute), lastSuccess: now.Add(-time.Minute),
			e: stored(f.b7, now.Add(-time.Hour), url), lastSucc2: now.Add(-time.Minute)},
		{name: "the same one held: only a later fetch time counts", held: f.b7, lastSuccess: now.Add(-time.Hour),
			e: stored(f.b7.Clone(), now.Add(-time.Minute), url), lastSucc2: now.Add(-time.Minute)},
		{name: "a conflicting one stored: an error, the held one kept", held: f.b7, lastSuccess: now.Add(-time.Minute),
			e: stored(variant(other, 7, 5*time.Minute), now, url), err: ErrSequenceConflict, lastSucc2: now.Add(-time.Minute)},
		{name: "a newer one stored: taken", held: f.b7, lastSuccess: now.Add(-time.Hour),
			e: stored(variant(other, 8, 5*time.Minute), now.Add(-time.Minute), url), took: true, lastSucc2: now.Add(-time.Minute), etag: `"s"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := f.relationship(tt.held, tt.lastSuccess, 0, false)
			took, err := r.restore(tt.e, now)
			if tt.err != nil {
				require.ErrorIs(t, err, tt.err)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tt.took, took)
			want := tt.held
			if tt.took {
				want = tt.e.Bundle
			}
			assert.Same(t, want, r.held)
			assert.Equal(t, tt.took, r.fromLKG)
			assert.Equal(t, tt.lastSucc2, r.lastSuccess)
			assert.Equal(t, tt.etag, r.etag)
		})
	}
}

// TestRelationshipReconfigured: a new configuration of a trust domain
// keeps its fetched bundle; an unfetched one takes the new bootstrap
// bundle.
func TestRelationshipReconfigured(t *testing.T) {
	f := newRelFixture(t)
	moved := f.ep
	moved.BootstrapBundle = testca.New(t, fetchTD).Bundle()

	r := f.relationship(f.b7, f.t0, 2, false)
	r.etag, r.polling, r.entry = `"v7"`, true, 3
	n := r.reconfigured(moved)
	assert.NotSame(t, r, n, "a poll of the old configuration finds itself replaced")
	assert.Same(t, f.b7, n.held)
	assert.Equal(t, 2, n.failures)
	assert.Equal(t, r.state, n.state)
	assert.Empty(t, n.etag)
	assert.False(t, n.polling)
	assert.Zero(t, n.entry)

	boot := f.relationship(f.bootstrap, time.Time{}, 1, false)
	assert.Same(t, moved.BootstrapBundle, boot.reconfigured(moved).held)
	moved.BootstrapBundle = nil
	assert.Nil(t, boot.reconfigured(moved).held)
}
