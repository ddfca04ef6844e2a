package trustpolicy

import "sync"

// Cell holds the current Policy and a channel closed when it is replaced,
// so that every SDS stream notices a policy change without polling.
type Cell struct {
	mu      sync.Mutex
	cur     *Policy
	changed chan struct{}
}

// NewCell returns a cell holding p (nil: no policy, every workload trusts
// every trust domain).
func NewCell(p *Policy) *Cell {
	return &Cell{cur: p, changed: make(chan struct{})}
}

// Set replaces the policy and wakes everyone waiting on the previous one.
func (c *Cell) Set(p *Policy) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cur = p
	close(c.changed)
	c.changed = make(chan struct{})
}

// Load returns the current policy and a channel closed when it is replaced.
func (c *Cell) Load() (*Policy, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur, c.changed
}
