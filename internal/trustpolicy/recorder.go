package trustpolicy

import (
	"slices"
	"sync"
)

// Bounds of what Access remembers of the workloads rules matched: the
// status of a ClusterTrustPolicy and /v1/snapshot show it, and callers
// (every SDS stream) must not be able to grow it without limit.
const (
	// MaxRecentWorkloads is how many recently matched SPIFFE IDs each
	// rule keeps.
	MaxRecentWorkloads = 20
	// MaxCountedWorkloads caps the distinct (rule, SPIFFE ID) pairs
	// counted across all rules; past it, counts are lower bounds.
	MaxCountedWorkloads = 100000
)

// MatchedWorkloads is what one rule matched since it was first seen.
type MatchedWorkloads struct {
	// Count is the number of distinct workloads (SPIFFE IDs) matched.
	Count int `json:"count"`
	// CountCapped says Count stopped growing at MaxCountedWorkloads: the
	// real number is higher.
	CountCapped bool `json:"countCapped,omitempty"`
	// Recent are the most recently matched IDs, newest first.
	Recent []string `json:"recent"`
}

type recorder struct {
	mu      sync.Mutex
	policy  *Policy
	rules   map[string]*ruleRecord
	counted int
}

type ruleRecord struct {
	seen   map[string]struct{}
	capped bool
	recent []string
}

func newRecorder() *recorder { return &recorder{rules: make(map[string]*ruleRecord)} }

func (r *recorder) record(p *Policy, d Decision, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p != r.policy {
		r.prune(p)
	}
	for _, m := range d.Matched {
		rr := r.rules[m.Rule]
		if rr == nil {
			rr = &ruleRecord{seen: make(map[string]struct{})}
			r.rules[m.Rule] = rr
		}
		r.add(rr, id)
	}
}

// prune forgets the rules p no longer has, so rule churn frees memory.
func (r *recorder) prune(p *Policy) {
	r.policy = p
	names := make(map[string]bool, len(p.rules))
	for _, cr := range p.rules {
		names[cr.Name] = true
	}
	for name, rr := range r.rules {
		if !names[name] {
			r.counted -= len(rr.seen)
			delete(r.rules, name)
		}
	}
}

func (r *recorder) add(rr *ruleRecord, id string) {
	if _, ok := rr.seen[id]; !ok {
		if r.counted < MaxCountedWorkloads {
			rr.seen[id] = struct{}{}
			r.counted++
		} else {
			rr.capped = true
		}
	}
	if i := slices.Index(rr.recent, id); i >= 0 {
		rr.recent = slices.Delete(rr.recent, i, i+1)
	} else if len(rr.recent) == MaxRecentWorkloads {
		rr.recent = rr.recent[:MaxRecentWorkloads-1]
	}
	rr.recent = slices.Insert(rr.recent, 0, id)
}

func (r *recorder) matched(rule string) MatchedWorkloads {
	r.mu.Lock()
	defer r.mu.Unlock()
	rr := r.rules[rule]
	if rr == nil {
		return MatchedWorkloads{Recent: []string{}}
	}
	return MatchedWorkloads{Count: len(rr.seen), CountCapped: rr.capped, Recent: slices.Clone(rr.recent)}
}
