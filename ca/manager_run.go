package ca

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/loop"
)

// recheck is Authority.Recheck.
func (m *manager) recheck() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// wakeSubscribers signals every Subscribe channel though nothing may
// have changed: the end of a Recheck.
func (m *manager) wakeSubscribers() {
	m.mu.Lock()
	defer m.mu.Unlock()
	signal(m.subs)
}

// recordCheck keeps the outcome of a scheduled check for Ready and
// reports a failure (metric, log); what says what was kept. Subscribers
// hear when checks start or cease to fail.
func (m *manager) recordCheck(err error, msg string) {
	m.mu.Lock()
	turned := (m.lastErr == nil) != (err == nil)
	m.lastErr = err
	if turned {
		signal(m.subs)
	}
	m.mu.Unlock()
	if err == nil {
		return
	}
	m.metrics.reconcileErrors.Inc()
	level := slog.LevelError
	if !turned && errors.Is(err, errNoIntermediate) {
		// Waiting for the upstream: upstreamFailed warned when the outage
		// began or changed, Ready says why; each recheck says nothing new.
		level = slog.LevelDebug
	}
	m.cfg.Logger.Log(context.Background(), level, msg, logattr.Error, err)
}

// checkError is Authority.CheckError.
func (m *manager) checkError() error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.lastErr
}

// nextCheck is when Reconcile next has work to do, or sooner so that
// changes from other processes are picked up.
func (m *manager) nextCheck(now time.Time) time.Time {
	m.mu.RLock()
	var next time.Time
	if m.cfg.Upstream != nil {
		next = m.nextUpstreamLocked(now)
	} else {
		_, _, next = m.timelineLocked().plan(now, m.timesLocked())
	}
	next = earliest(next, m.nextJWTStepLocked(now))
	m.mu.RUnlock()
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

// run is Authority.Run.
func (m *manager) run(ctx context.Context) error {
	if m.cfg.Plugin != nil {
		return m.runPlugin(ctx)
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
		m.recordCheck(m.reconcile(), "CA rotation check failed; keeping the current roots")
		arm()
	})
	arm = func() {
		armMu.Lock()
		defer armMu.Unlock()
		if entry != 0 {
			c.Remove(entry)
		}
		entry = c.Schedule(loop.Once(m.nextCheck(m.cfg.Clock.Now())), job)
	}
	arm()
	c.Start()
	for {
		select {
		case <-ctx.Done():
			<-c.Stop().Done()
			return nil
		case <-m.kick:
			job()
			m.wakeSubscribers()
		}
	}
}

// nextJWTStepLocked is when the JWT keys' plan next has work, or zero
// when it has none or some is due already (the check that just ran could
// not do it, say on a follower: the recheck interval paces retries).
func (m *manager) nextJWTStepLocked(now time.Time) time.Time {
	_, _, next := m.jwtTimelineLocked().plan(now, m.jwtTimesLocked())
	return next
}

// earliest is the earlier of two times, zero meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
