package loop

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/assert"
)

func TestFunc(t *testing.T) {
	var _ cron.Schedule = Schedule(nil)
	now := time.Date(2026, 11, 22, 5, 0, 0, 0, time.UTC)

	assert.True(t, Schedule(nil).Next(now).IsZero(), "nil Func must park the entry")

	var got time.Time
	s := Schedule(func(t time.Time) time.Time {
		got = t
		return t.Add(time.Minute)
	})
	assert.Equal(t, now.Add(time.Minute), s.Next(now))
	assert.Equal(t, now, got)
}

// TestFuncDrivesCron runs a real cron on Func inside a synctest bubble
// (cron reads time.Now and uses timers): the job fires at the times Func
// returns, and Func is asked again after each run.
func TestFuncDrivesCron(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var (
			mu   sync.Mutex
			runs []time.Duration
		)
		c := cron.New(cron.WithLocation(time.UTC))
		c.Schedule(Schedule(func(t time.Time) time.Time { return t.Add(time.Minute) }), cron.FuncJob(func() {
			mu.Lock()
			runs = append(runs, time.Since(start))
			mu.Unlock()
		}))
		c.Start()
		time.Sleep(3*time.Minute + time.Second)
		<-c.Stop().Done()

		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, []time.Duration{time.Minute, 2 * time.Minute, 3 * time.Minute}, runs)
	})
}

// TestOnceFiresOnceAndParks: the entry runs at its time, then waits to be
// re-added; a time already past runs at once.
func TestOnceFiresOnceAndParks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var (
			mu   sync.Mutex
			runs []time.Duration
		)
		c := cron.New(cron.WithLocation(time.UTC))
		job := cron.FuncJob(func() {
			mu.Lock()
			runs = append(runs, time.Since(start).Truncate(time.Second))
			mu.Unlock()
		})
		c.Schedule(Once(start.Add(time.Minute)), job)
		c.Schedule(Once(start.Add(-time.Hour)), job)
		c.Start()
		time.Sleep(5 * time.Minute)
		<-c.Stop().Done()

		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, []time.Duration{0, time.Minute}, runs)
	})
}
