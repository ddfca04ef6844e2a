package federation

import (
	"time"

	"github.com/trustbridge/trustbridge/internal/loop"
)

// Refresh timing (SPIFFE Federation §6.2: poll at the bundle's refresh hint,
// about five minutes when it has none, and retry after a failure without
// hammering the endpoint).
const (
	// DefaultRefresh is the interval used when a bundle carries no
	// spiffe_refresh_hint.
	DefaultRefresh = 5 * time.Minute
	// DefaultMinRefresh and DefaultMaxRefresh are the server-wide clamps
	// (--federation-min-refresh, --federation-max-refresh) when none are
	// configured.
	DefaultMinRefresh = 30 * time.Second
	DefaultMaxRefresh = time.Hour
	// MinRetry is the first retry delay after a failure and the floor of
	// every delay NextRefresh returns: nothing polls a peer more often.
	MinRetry = time.Second
)

// jitterFraction spreads polls of many trust domains (and of many servers
// polling one hub) so they do not fire in lockstep.
const jitterFraction = 0.1

// RefreshPolicy bounds the polling interval of one trust domain. A zero
// field sets no bound of its own; the absolute bounds of per-endpoint
// settings (1s to 30 days) always apply.
type RefreshPolicy struct {
	Min, Max time.Duration
}

// For returns the policy for ep: the endpoint's non-zero Refresh fields
// override the server-wide ones. When the result would be inverted (an
// endpoint sets only Min, above the server Max, or only Max, below the
// server Min), the bound the operator set for this endpoint wins and the
// other follows it, since a per-endpoint setting is the more specific intent.
func (p RefreshPolicy) For(ep Endpoint) RefreshPolicy {
	out := p
	if ep.Refresh.Min > 0 {
		out.Min = ep.Refresh.Min
	}
	if ep.Refresh.Max > 0 {
		out.Max = ep.Refresh.Max
	}
	if out.Min > 0 && out.Max > 0 && out.Min > out.Max {
		if ep.Refresh.Max > 0 {
			out.Min = out.Max
		} else {
			out.Max = out.Min
		}
	}
	return out
}

// RefreshInterval is the polling interval for a bundle whose refresh hint
// is hint (hasHint false: the bundle had none, DefaultRefresh applies),
// clamped into [p.Min, p.Max] and into the absolute bounds of 1s to 30
// days. A negative hint counts as zero and is clamped up like one. If p is
// inverted, Max wins: polling too often costs the peer a request, polling
// too rarely keeps revoked keys trusted.
func RefreshInterval(hint time.Duration, hasHint bool, p RefreshPolicy) time.Duration {
	d := DefaultRefresh
	if hasHint {
		d = hint
	}
	if p.Min > 0 && d < p.Min {
		d = p.Min
	}
	if p.Max > 0 && d > p.Max {
		d = p.Max
	}
	return min(max(d, minRefreshBound), maxRefreshBound)
}

// NextRefresh is the delay before the next fetch.
//
// After a success (failures == 0) it is interval with ±10% jitter. After
// failures consecutive failures it is an exponential backoff from MinRetry
// (1s, 2s, 4s, ...) with the same jitter, never later than interval: a
// failing peer is retried at least as often as a healthy one is polled,
// but never aggressively (§6.2). The result is never below MinRetry, even
// for an interval under a second.
//
// rnd is a uniform random number in [0, 1) supplied by the caller, so the
// function stays pure and testable: 0 maps to -10%, 0.5 to no jitter and
// values approaching 1 to +10%. Values outside [0, 1) are clamped; NaN
// means no jitter.
func NextRefresh(interval time.Duration, failures int, rnd float64) time.Duration {
	interval = max(interval, MinRetry)
	if failures <= 0 {
		return max(loop.Jitter(interval, jitterFraction, rnd), MinRetry)
	}
	return loop.Backoff{Base: MinRetry, Max: interval, Jitter: jitterFraction}.Delay(failures, rnd)
}
