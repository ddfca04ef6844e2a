// Package schedule adapts trustbridge's pure timing functions to
// robfig/cron.
//
// cron asks a schedule for its next time when the entry is added and
// again right after it starts the job, before the job has run. A job whose
// outcome decides the next time (a poll's success or failure, a rotation
// step it just made due) therefore re-adds its entry with Once when it
// finishes.
package loop

import (
	"sync/atomic"
	"time"

	"github.com/robfig/cron/v3"
)

// Func adapts a function to cron.Schedule. A zero time parks the entry:
// cron never runs it until it is removed and added again. A nil Func
// never fires.
type Schedule func(t time.Time) time.Time

// Next implements cron.Schedule.
func (f Schedule) Next(t time.Time) time.Time {
	if f == nil {
		return time.Time{}
	}
	return f(t)
}

// Once fires at at (at once when at has passed) and then parks.
func Once(at time.Time) cron.Schedule {
	var asked atomic.Bool
	return Schedule(func(time.Time) time.Time {
		if asked.Swap(true) {
			return time.Time{}
		}
		return at
	})
}
