package federation

import "github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

// Bundles returns the bundle held for every federated trust domain (the
// last good one fetched, restored or bootstrapped), as published by its
// endpoint: the poller's own state, for tests to compare with what it set
// in the Sink, which every consumer reads.
func (p *Poller) Bundles() []*spiffebundle.Bundle {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*spiffebundle.Bundle, 0, len(p.order))
	for _, td := range p.order {
		if b := p.rels[td].held; b != nil {
			out = append(out, b)
		}
	}
	return out
}
