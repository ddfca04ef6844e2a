package identitymap

import (
	"sync"
	"sync/atomic"
)

// Cell holds the current Map, read without a lock on every attestation,
// and a channel closed when it is replaced, so that the agent can
// re-identify its workloads when the rules change without polling.
type Cell struct {
	mu  sync.Mutex // serialises Set
	cur atomic.Pointer[cellState]
}

type cellState struct {
	m       *Map
	changed chan struct{}
}

// NewCell returns a cell holding m (nil until a Combiner publishes: no
// workload has an identity).
func NewCell(m *Map) *Cell {
	c := &Cell{}
	c.cur.Store(&cellState{m: m, changed: make(chan struct{})})
	return c
}

// Set replaces the map and wakes everyone waiting on the previous one.
func (c *Cell) Set(m *Map) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.cur.Swap(&cellState{m: m, changed: make(chan struct{})})
	close(old.changed)
}

// Load returns the current map.
func (c *Cell) Load() *Map { return c.cur.Load().m }

// Watch returns the current map and a channel closed when it is replaced.
func (c *Cell) Watch() (*Map, <-chan struct{}) {
	s := c.cur.Load()
	return s.m, s.changed
}
