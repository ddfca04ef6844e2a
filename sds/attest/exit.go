package attest

import (
	"sync"
	"time"
)

// exitPollInterval is how often Exited re-checks a process it has no
// pollable pidfd for (kernels before 5.3): an exit is seen this late at
// most, at the cost of one stat read per interval and Caller.
const exitPollInterval = time.Second

// exitWatch is the state of a Caller's Exited.
type exitWatch struct {
	mu sync.Mutex
	// exited is made by the first Exited, closed by its watcher.
	exited chan struct{}
	// stop is closed by release: the poller ends.
	stop     chan struct{}
	released bool
}

// Exited returns a channel closed once the pinned process has exited (it
// may not be reaped yet), so that a stream serving it can end with it. It
// is also closed once c is released (Close for PinPID's Caller, the
// connection's end for a socket's): nothing is watched then. A Caller
// that was never pinned (Attest refuses it) is taken as exited.
//
// With a pidfd the wait parks on the runtime's poller, holding no thread;
// without one the process is re-checked every second.
func (c *Caller) Exited() <-chan struct{} {
	w := &c.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.exited != nil {
		return w.exited
	}
	w.exited = make(chan struct{})
	if w.released || c.err != nil {
		close(w.exited)
		return w.exited
	}
	w.stop = make(chan struct{})
	go c.waitExit(w.exited, w.stop)
	return w.exited
}

func (c *Caller) waitExit(exited chan<- struct{}, stop <-chan struct{}) {
	defer close(exited)
	if c.pidfd != nil {
		if err := pidfdWait(c.pidfd); err == nil || c.watch.isReleased() {
			return
		}
		// The pidfd cannot be waited on here (not pollable): poll.
	}
	t := time.NewTicker(exitPollInterval)
	defer t.Stop()
	for c.alive() == nil {
		select {
		case <-t.C:
		case <-stop:
			return
		}
	}
}

// release marks the watch released and stops its poller; it reports
// whether this call did (the first one).
func (w *exitWatch) release() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.released {
		return false
	}
	w.released = true
	if w.stop != nil {
		close(w.stop)
	}
	return true
}

func (w *exitWatch) isReleased() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.released
}
