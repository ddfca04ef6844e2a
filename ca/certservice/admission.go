package certservice

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
)

// admission bounds the signing work the service takes on: a rate limit
// per authenticated identity (Config.RateLimit), a few signings at once
// (Config.Concurrency), and behind them a queue of requests waiting
// their turn in arrival order, bounded in number (Config.QueueSize) and
// in time (Config.QueueTimeout, and the caller's deadline). Every
// signing path (certificates, JWT-SVIDs, intermediates) is admitted
// here, with the same refusals.
//
// A burst (a node's pods restarting, ztunnel asking for every pod at
// once) therefore waits rather than being refused: a refusal Istio's
// client retries only a few times within seconds, while the wait costs
// only memory (a waiting request holds its decoded request and a
// goroutine; see docs/operations.md, "Sizing for bursts").
type admission struct {
	limits *ratelimit.Keyed // nil when off
	rate   rate.Limit       // named in the refusal
	// slots are the signings in flight. x/sync's weighted semaphore
	// serves its waiters in arrival order and removes one whose context
	// ends, which is the queue this needs.
	slots      *semaphore.Weighted
	queueSize  int64
	waiting    atomic.Int64 // places (queuePlaces) of the requests inside slots.Acquire
	maxWait    time.Duration
	clock      clock.PassiveClock
	timers     clock.WithDelayedExecution // the max wait's timer
	m          *metrics
	authorized func(context.Context) // Config.Authorized, nil when none
	// queued, set by tests, hears of each request that starts waiting.
	queued atomic.Pointer[func()]
}

// queueUnit is the request size one place in the queue holds: a request
// larger than this (a CSR with many or long names, up to ca.MaxCSRSize)
// takes one place per queueUnit bytes, so that the queue's memory is
// bounded by Config.QueueSize whatever the requests' sizes. A typical
// request (a P-256 CSR, about 500 bytes) takes one.
const queueUnit = 4 << 10

// metadataSize is what a call's request headers hold while it waits:
// each field's name and value, and 32 bytes more, as HTTP/2 counts a
// header list's size.
func metadataSize(ctx context.Context) int {
	md, _ := metadata.FromIncomingContext(ctx)
	n := 0
	for k, vs := range md {
		for _, v := range vs {
			n += len(k) + len(v) + 32
		}
	}
	return n
}

// queuePlaces is the places of the queue a request of size bytes takes.
func queuePlaces(size int) int64 {
	return max(1, int64((size+queueUnit-1)/queueUnit))
}

// errQueueTimeout ends a wait that reached Config.QueueTimeout.
var errQueueTimeout = errors.New("signing queue timeout")

// newAdmission is the admission of cfg, its defaults applied, counted
// in m.
func newAdmission(cfg Config, m *metrics) *admission {
	a := &admission{rate: cfg.RateLimit, slots: semaphore.NewWeighted(int64(cfg.Concurrency)), queueSize: int64(cfg.QueueSize),
		maxWait: cfg.QueueTimeout, clock: cfg.Clock, m: m, authorized: cfg.Authorized}
	if cfg.RateLimit > 0 {
		a.limits = ratelimit.NewKeyed(cfg.RateLimit, cfg.RateBurst, cfg.MaxRateLimiters)
	}
	a.timers = clock.RealClock{}
	if c, ok := cfg.Clock.(clock.WithDelayedExecution); ok {
		a.timers = c
	}
	return a
}

// admit charges a signing for the caller's own identity to its rate
// limit, then waits for a slot (acquire); release gives the slot back.
// It is charge then acquire, for a request that checks nothing costly in
// between.
func (a *admission) admit(ctx context.Context, caller spiffeid.ID, size int) (release func(), ref *refusal) {
	if ref := a.charge(authn.Identity{ID: caller}, caller); ref != nil {
		return nil, ref
	}
	return a.acquire(ctx, size, true)
}

// charge charges a signing for id to the caller's rate limit. A node
// proxy impersonating pods is charged once for itself and once per
// workload it asks for, so it has an overall bound and the workload's own
// pods elsewhere cannot spend the budget it needs for the pods of its
// node.
func (a *admission) charge(caller authn.Identity, id spiffeid.ID) *refusal {
	if a.allow(caller, id) {
		return nil
	}
	return &refusal{codes.ResourceExhausted, "rate_limited",
		fmt.Sprintf("rate limit of %v signings/s for %s exceeded; retry later", float64(a.rate), caller.ID), nil}
}

// allow reports whether the rate limits of charge have room. An
// impersonating caller proven by a token bound to a pod is charged as
// that pod: one node agent (or ztunnel) service account is every node's,
// and one node's workloads must not spend every other node's budget.
func (a *admission) allow(caller authn.Identity, id spiffeid.ID) bool {
	if a.limits == nil {
		return true
	}
	now := a.clock.Now()
	if caller.ID == id {
		return a.limits.Allow(id.String(), now)
	}
	key := caller.ID.String()
	if caller.Pod.UID != "" {
		key += " pod " + caller.Pod.UID
	}
	return a.limits.Allow(key, now) && a.limits.Allow(key+" for "+id.String(), now)
}

// acquire takes one of the signing slots for a request of size bytes,
// whose caller every check before signing has passed (Config.Authorized
// hears of it), waiting its turn behind the requests that came before
// it; release gives the slot back. It is refused at once when the queue
// is full (an empty queue takes one request however large), and when
// the wait reaches the server's maximum; a caller that leaves (its
// context canceled or past its deadline) leaves the queue at once. Both
// refusals are ResourceExhausted, which Istio's client and
// trustbridge's agents retry.
//
// confirm says whether Config.Authorized hears of the request: false for
// a caller proven by a single-use credential (authn.Identity.Spend),
// which a refusal after this (a bad CSR) leaves unspent, so that one such
// token cannot confirm connection after connection; it confirms by
// succeeding, as any call does.
func (a *admission) acquire(ctx context.Context, size int, confirm bool) (release func(), ref *refusal) {
	if err := ctx.Err(); err != nil {
		return nil, callerLeft(err)
	}
	if confirm && a.authorized != nil {
		a.authorized(ctx)
	}
	if a.slots.TryAcquire(1) {
		a.m.queueWait.Observe(0)
		return a.release, nil
	}
	// A waiting call holds its request headers too (gRPC keeps them in
	// its context), up to certservice.MaxHeaderListSize.
	places := queuePlaces(size + metadataSize(ctx))
	if ref := a.enqueue(places); ref != nil {
		return nil, ref
	}
	defer a.dequeue(places)
	return a.wait(ctx)
}

// enqueue counts a request of places in the queue, or refuses it when
// they do not fit.
func (a *admission) enqueue(places int64) *refusal {
	// Compare and swap, so that a request refused never counts, even for
	// a moment, against the others.
	for {
		n := a.waiting.Load()
		if n != 0 && n+places > a.queueSize {
			return &refusal{codes.ResourceExhausted, "queue_full", fmt.Sprintf(
				"signing queue full (%d places, one per request of up to %d bytes); retry later, with backoff (the server's operator can raise --sign-queue-size)",
				a.queueSize, queueUnit), nil}
		}
		if a.waiting.CompareAndSwap(n, n+places) {
			break
		}
	}
	a.m.queueWaiting.Inc()
	if f := a.queued.Load(); f != nil {
		(*f)()
	}
	return nil
}

func (a *admission) dequeue(places int64) {
	a.waiting.Add(-places)
	a.m.queueWaiting.Dec()
}

// wait waits in the queue for a slot, at most the server's maximum.
func (a *admission) wait(ctx context.Context) (release func(), ref *refusal) {
	wctx, stop := a.withMaxWait(ctx)
	defer stop()
	start := a.clock.Now()
	err := a.slots.Acquire(wctx, 1)
	a.m.queueWait.Observe(a.clock.Since(start).Seconds())
	switch {
	case err == nil:
		return a.release, nil
	case ctx.Err() != nil:
		return nil, callerLeft(ctx.Err())
	case errors.Is(context.Cause(wctx), errQueueTimeout):
		return nil, &refusal{codes.ResourceExhausted, "queue_timeout", fmt.Sprintf(
			"waited %s in the signing queue, the server's maximum; retry later, with backoff (the server's operator can raise --sign-queue-timeout or --sign-concurrency)", a.maxWait), nil}
	}
	return nil, &refusal{codes.Internal, "internal", "internal error", err}
}

// withMaxWait is ctx ended, with errQueueTimeout as its cause, after
// the server's maximum wait on a.timers (a fake clock in tests).
func (a *admission) withMaxWait(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	t := a.timers.AfterFunc(a.maxWait, func() { cancel(errQueueTimeout) })
	return ctx, func() {
		t.Stop()
		cancel(nil)
	}
}

func (a *admission) release() { a.slots.Release(1) }

// callerLeft is the refusal of a request whose caller canceled it or
// whose deadline passed before it was signed.
func callerLeft(err error) *refusal {
	return &refusal{status.FromContextError(err).Code(), "canceled", "request canceled, or its deadline passed, before it was signed", nil}
}
