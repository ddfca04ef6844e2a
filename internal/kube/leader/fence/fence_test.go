package fence

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type leader bool

func (l leader) IsLeader() bool { return bool(l) }

// lease leads until until (zero: it does not).
type lease struct{ until time.Time }

func (l lease) IsLeader() bool          { return !l.until.IsZero() }
func (l lease) LeadingUntil() time.Time { return l.until }

var errAPI = errors.New("etcd is down")

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name   string
		leader Leader
		want   error
	}{
		{"no leader: a single replica", nil, nil},
		{"leads", leader(true), nil},
		{"follows", leader(false), ErrNotLeader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Writer{Leader: tc.leader, Timeout: time.Second}.Check("delete")
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
			assert.EqualError(t, err, "not the leader: refusing to delete")
		})
	}
}

func TestWrite(t *testing.T) {
	far := time.Now().Add(time.Hour)
	for _, tc := range []struct {
		name      string
		leader    Leader
		writeErr  error
		wantCall  bool
		wantErr   error  // errors.Is
		wantMsg   string // "" when no error
		notLeader bool
	}{
		{"no leader", nil, nil, true, nil, "", false},
		{"no leader, the write fails", nil, errAPI, true, errAPI, "etcd is down", false},
		{"follows", leader(false), nil, false, ErrNotLeader, "not the leader: refusing to write", true},
		{"leads, not lease-bound", leader(true), errAPI, true, errAPI, "etcd is down", false},
		{"lease held", lease{until: far}, nil, true, nil, "", false},
		{"lease held, the write fails before it ends", lease{until: far}, errAPI, true, errAPI, "etcd is down", false},
		{"leads by IsLeader but the lease is already gone", leadsWithoutLease{}, nil, false, ErrNotLeader, "not the leader: refusing to write", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			called := false
			err := Writer{Leader: tc.leader, Timeout: time.Minute}.Write(func(context.Context) error {
				called = true
				return tc.writeErr
			})
			assert.Equal(t, tc.wantCall, called)
			if tc.wantMsg == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.wantErr)
			assert.Equal(t, tc.notLeader, errors.Is(err, ErrNotLeader))
			assert.EqualError(t, err, tc.wantMsg)
		})
	}
}

// leadsWithoutLease says it leads, but its lease already ended.
type leadsWithoutLease struct{}

func (leadsWithoutLease) IsLeader() bool          { return true }
func (leadsWithoutLease) LeadingUntil() time.Time { return time.Time{} }

// The write's deadline is the lease's end when that comes before Timeout,
// and Timeout's otherwise.
func TestWriteDeadline(t *testing.T) {
	soon, far := time.Now().Add(time.Minute), time.Now().Add(time.Hour)
	for _, tc := range []struct {
		name   string
		leader Leader
		want   func(start time.Time, dl time.Time) bool
	}{
		{"lease ends first", lease{until: soon}, func(_, dl time.Time) bool { return dl.Equal(soon) }},
		{"timeout first", lease{until: far}, func(start, dl time.Time) bool { return dl.Before(far) && !dl.Before(start.Add(10*time.Minute)) }},
		{"no lease", leader(true), func(start, dl time.Time) bool { return !dl.Before(start.Add(10 * time.Minute)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			var dl time.Time
			require.NoError(t, Writer{Leader: tc.leader, Timeout: 10 * time.Minute}.Write(func(ctx context.Context) error {
				var ok bool
				dl, ok = ctx.Deadline()
				assert.True(t, ok)
				return nil
			}))
			assert.True(t, tc.want(start, dl), "deadline %v", dl)
		})
	}
}

// A write that fails once the lease has ended may have gone out after
// another replica took over: ErrNotLeader, with the write's error said.
func TestWriteFailingPastTheLease(t *testing.T) {
	until := time.Now().Add(50 * time.Millisecond)
	err := Writer{Leader: lease{until: until}, Timeout: time.Minute}.Write(func(ctx context.Context) error {
		<-ctx.Done() // the deadline is the lease's end
		return ctx.Err()
	})
	require.ErrorIs(t, err, ErrNotLeader)
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "the write's error is in the message only")
	assert.EqualError(t, err, "not the leader: leadership may have lapsed during the write: context deadline exceeded")
}
