package ha

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeCA becomes ready when kicked while ready is allowed (a leader's
// bootstrap or a follower's reload of what the leader wrote).
type fakeCA struct {
	mu      sync.Mutex
	canSign bool // what a kick would load
	ready   bool
	kicks   atomic.Int32
	changes chan struct{}
}

func newFakeCA() *fakeCA { return &fakeCA{changes: make(chan struct{}, 1)} }

func (c *fakeCA) Run(ctx context.Context) error { <-ctx.Done(); return nil }
func (c *fakeCA) Subscribe() <-chan struct{}    { return c.changes }
func (c *fakeCA) Recheck() {
	c.kicks.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.canSign && !c.ready {
		c.ready = true
		select {
		case c.changes <- struct{}{}:
		default:
		}
	}
}

func (c *fakeCA) Ready() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ready {
		return errors.New("no roots yet")
	}
	return nil
}

// fakeElector leads when told to, for as long as the term lasts.
type fakeElector struct {
	elect chan context.Context // a term: leads until its context ends
	err   error                // Run's result once a term channel closes
}

func (e *fakeElector) Run(ctx context.Context, lead func(context.Context) error) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case term, ok := <-e.elect:
			if !ok {
				return e.err
			}
			if err := lead(term); err != nil {
				return err
			}
		}
	}
}

func watchNothing(ctx context.Context, _ func()) error { <-ctx.Done(); return nil }

// TestReplicaLeadsOnlyWithDuties: Start returns once the CA can sign (the
// leader's kick loads it), the leader's duties wait for Lead, and a later
// term runs them again.
func TestReplicaLeadsOnlyWithDuties(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca := newFakeCA()
		ca.canSign = true
		el := &fakeElector{elect: make(chan context.Context)}
		started := make(chan *Replica, 1)
		go func() {
			r, err := Start(t.Context(), Config{CA: ca, WatchCA: watchNothing, Elector: el, State: "ns/ca"})
			assert.NoError(t, err)
			started <- r
		}()
		synctest.Wait()
		require.Empty(t, started, "not ready before a leader bootstraps the CA")

		term1, end1 := context.WithCancel(t.Context())
		el.elect <- term1
		r := <-started
		require.NotNil(t, r)
		assert.Equal(t, int32(1), ca.kicks.Load(), "a new leader looks at the CA at once")

		var runs atomic.Int32
		duty := func(ctx context.Context) error { runs.Add(1); <-ctx.Done(); return nil }
		synctest.Wait()
		assert.Zero(t, runs.Load(), "no duty before the server hands them over")
		r.Lead(duty)
		synctest.Wait()
		assert.Equal(t, int32(1), runs.Load())

		end1()
		synctest.Wait()
		term2, end2 := context.WithCancel(t.Context())
		el.elect <- term2
		synctest.Wait()
		assert.Equal(t, int32(2), runs.Load(), "the next term runs the duties again")
		end2()
		require.NoError(t, r.Stop())
	})
}

// TestReplicaStartStops: ctx ending before the CA can sign is a clean
// (nil, nil); the background ending first is an error; Run reports a
// stopped election.
func TestReplicaStartStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			r, err := Start(ctx, Config{CA: newFakeCA(), WatchCA: watchNothing, Elector: &fakeElector{}})
			assert.Nil(t, r)
			assert.NoError(t, err, "stopped while waiting for a first leader")
		}()
		synctest.Wait()
		cancel()
		<-done

		el := &fakeElector{elect: make(chan context.Context), err: errors.New("lease lost for good")}
		close(el.elect)
		r, err := Start(t.Context(), Config{CA: newFakeCA(), WatchCA: watchNothing, Elector: el})
		assert.Nil(t, r)
		assert.ErrorContains(t, err, "lease lost for good")

		ca := newFakeCA()
		ca.canSign = true
		ca.Recheck() // a follower that loaded the leader's state
		el = &fakeElector{elect: make(chan context.Context)}
		r, err = Start(t.Context(), Config{CA: ca, WatchCA: watchNothing, Elector: el})
		require.NoError(t, err)
		el.err = errors.New("elector gave up")
		close(el.elect)
		assert.ErrorContains(t, r.Run(t.Context()), "elector gave up")
	})
}

// settledCA is never ready, and answers Ready only once every other
// goroutine of the bubble is blocked or gone: the background Start runs
// has then returned on an ended ctx.
type settledCA struct{ *fakeCA }

func (c settledCA) Ready() error {
	synctest.Wait()
	return c.fakeCA.Ready()
}

// A ctx already ended when Start is called is a clean stop too, whichever
// Start sees first: the ended ctx, or the background it ended (which then
// returned nil). Start sees both at once here, and picks at random.
func TestReplicaStartWithEndedContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		for range 100 {
			r, err := Start(ctx, Config{CA: settledCA{newFakeCA()}, WatchCA: watchNothing, Elector: &fakeElector{}})
			require.Nil(t, r)
			require.NoError(t, err, "a stop is not a failure")
		}
	})
}
