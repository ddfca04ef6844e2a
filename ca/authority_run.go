package ca

import (
	"context"
	"sync"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/loop"
)

// Recheck asks for a fresh look now rather than at the next scheduled
// check: Run checks the state (a reload, a rotation step that is due),
// then wakes every subscriber to look again though nothing may have
// changed. Call it when the shared state changed (a watch saw another
// process write) or when this replica became the leader, which looks
// again at what it records from now on (the audit trail writes only
// while leading). It never blocks; rechecks asked for while one is
// pending coalesce.
func (a *Authority) Recheck() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// wakeSubscribers signals every Subscribe channel though nothing may
// have changed: the end of a Recheck.
func (a *Authority) wakeSubscribers() {
	a.mu.Lock()
	defer a.mu.Unlock()
	signal(a.subs)
}

// recordCheck keeps the outcome of a scheduled check for Ready and
// reports a failure (metric, log); what says what was kept. Subscribers
// hear when checks start or cease to fail.
func (a *Authority) recordCheck(err error, msg string) {
	a.mu.Lock()
	turned := (a.lastErr == nil) != (err == nil)
	a.lastErr = err
	if turned {
		signal(a.subs)
	}
	a.mu.Unlock()
	if err != nil {
		a.metrics.reconcileErrors.Inc()
		a.cfg.Logger.Error(msg, logattr.Error, err)
	}
}

// CheckError is the error of the last scheduled check (a rotation the
// key manager refused, an upstream that left no valid intermediate), or
// nil when it succeeded; the CA keeps signing with what it had.
func (a *Authority) CheckError() error {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.lastErr
}

// nextCheck is when Reconcile next has work to do, or sooner so that
// changes from other processes are picked up.
func (a *Authority) nextCheck(now time.Time) time.Time {
	a.mu.RLock()
	var next time.Time
	if a.cfg.Upstream != nil {
		next = a.nextUpstreamLocked(now)
	} else {
		_, _, next = a.timelineLocked().plan(now, a.timesLocked())
	}
	next = earliest(next, a.nextJWTStepLocked(now))
	a.mu.RUnlock()
	return recheckBy(now, next)
}

// recheckBy is when to check next for work planned at next: then, but no
// later than recheckInterval from now, so that changes from other
// processes are picked up and a step that is due (zero: the check that
// just ran could not make it) is retried.
func recheckBy(now, next time.Time) time.Time {
	limit := now.Add(recheckInterval)
	if next.IsZero() || next.After(limit) {
		return limit
	}
	return next
}

// retryBy is recheckBy for work planned at next, seen by a check that
// ran at checked: work due by then and still planned is work that check
// could not do (a failed commit), retried at the recheck rather than at
// once, which would spin for as long as the failure lasts. Work that came
// due after the check is done now.
func retryBy(now, checked, next time.Time) time.Time {
	if !next.After(checked) {
		next = time.Time{}
	}
	return recheckBy(now, next)
}

// Run reconciles on schedule (self-signed mode) or follows the plug-in
// directory (plug-in mode) until ctx is done.
func (a *Authority) Run(ctx context.Context) error {
	if a.cfg.Plugin != nil {
		return a.runPlugin(ctx)
	}
	c := cron.New(cron.WithLocation(time.UTC))
	// cron asks the schedule for the next time right after starting a job,
	// before the job has run; a step the job itself makes due (activation
	// after publication) would wait for the next recheck. So each run
	// re-arms the entry with the time the plan gives after it.
	var (
		armMu sync.Mutex
		entry cron.EntryID
		arm   func()
	)
	job := cron.FuncJob(func() {
		a.recordCheck(a.Reconcile(), "CA rotation check failed; keeping the current roots")
		arm()
	})
	arm = func() {
		armMu.Lock()
		defer armMu.Unlock()
		if entry != 0 {
			c.Remove(entry)
		}
		entry = c.Schedule(loop.Once(a.nextCheck(a.cfg.Clock.Now())), job)
	}
	arm()
	c.Start()
	for {
		select {
		case <-ctx.Done():
			<-c.Stop().Done()
			return nil
		case <-a.kick:
			job()
			a.wakeSubscribers()
		}
	}
}

// nextJWTStepLocked is when the JWT keys' plan next has work, or zero
// when it has none or some is due already (the check that just ran could
// not do it, say on a follower: the recheck interval paces retries).
func (a *Authority) nextJWTStepLocked(now time.Time) time.Time {
	_, _, next := a.jwtTimelineLocked().plan(now, a.jwtTimesLocked())
	return next
}

// earliest is the earlier of two times, zero meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
