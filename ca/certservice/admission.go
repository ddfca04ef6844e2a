package certservice

import (
	"fmt"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
)

// admission bounds the signing work the service takes on: a rate limit
// per authenticated identity (Config.RateLimit) and a fixed number of
// signings in flight (Config.QueueSize). Every signing path (certificates,
// JWT-SVIDs, intermediates) is admitted here, with the same refusals.
type admission struct {
	limits *ratelimit.Keyed // nil when off
	rate   rate.Limit       // named in the refusal
	slots  chan struct{}
	clock  clock.PassiveClock
}

// newAdmission is the admission of cfg, its defaults applied.
func newAdmission(cfg Config) *admission {
	a := &admission{rate: cfg.RateLimit, slots: make(chan struct{}, cfg.QueueSize), clock: cfg.Clock}
	if cfg.RateLimit > 0 {
		a.limits = ratelimit.NewKeyed(cfg.RateLimit, cfg.RateBurst, cfg.MaxRateLimiters)
	}
	return a
}

// admit charges a signing for the caller's own identity to its rate
// limit, then takes a slot; release gives the slot back. It is charge
// then acquire, for a request that checks nothing costly in between.
func (a *admission) admit(caller spiffeid.ID) (release func(), ref *refusal) {
	if ref := a.charge(authn.Identity{ID: caller}, caller); ref != nil {
		return nil, ref
	}
	return a.acquire()
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

// acquire takes one of the slots of signings in flight; release gives it
// back. When they are all taken the request is refused at once, and the
// client retries: more in flight than a few per core only adds latency.
func (a *admission) acquire() (release func(), ref *refusal) {
	select {
	case a.slots <- struct{}{}:
		return func() { <-a.slots }, nil
	default:
		return nil, &refusal{codes.ResourceExhausted, "queue_full", "signing queue full; retry later", nil}
	}
}
