package trustpolicy

import (
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/fileutil/rulesource"
)

// Status is what one policy source last did, for /v1/snapshot, metrics and
// the audit log.
type Status = rulesource.Status

// Publish describes one policy the Combiner put in its Cell.
type Publish struct {
	// Source is the source whose change caused it; "" for SetDefault and
	// the first policy, published by NewCombiner.
	Source string
	// Policy is the compiled policy, never nil (the Cell holds nil instead
	// when it has no rules and the default is allow: no policy).
	Policy   *Policy
	Previous *Policy
}

// Combiner merges the rules of every source (file, config, CRD) with the
// default into one Policy and publishes it in Cell. A source whose new
// rules do not compile keeps its last good rules; the error is in Status.
//
// Rule names are unique across sources. The default is the strictest of
// the Combiner's own (the --trust-policy-default flag) and those the
// sources' documents set: deny if any says deny, so that a file cannot
// quietly widen what the operator configured.
type Combiner struct {
	local   spiffeid.TrustDomain
	cell    *Cell
	clock   clock.PassiveClock
	hook    func(Publish)
	reg     prometheus.Registerer
	metrics *rulesource.Metrics

	mu      sync.Mutex
	def     Default
	sources *rulesource.Sources[Rule, Default]
	current *Policy
}

// CombinerOption configures a Combiner.
type CombinerOption func(*Combiner)

// WithClock sets the clock of Status.LastSuccess and the reload metrics.
func WithClock(c clock.PassiveClock) CombinerOption { return func(cb *Combiner) { cb.clock = c } }

// WithRegisterer registers the trust policy metrics (reloads, rules and
// last success, by source) on reg.
func WithRegisterer(reg prometheus.Registerer) CombinerOption {
	return func(cb *Combiner) { cb.reg = reg }
}

// WithPublishHook calls f, under the Combiner's lock, with every policy it
// publishes: the audit log's feed. f must not call the Combiner.
func WithPublishHook(f func(Publish)) CombinerOption { return func(cb *Combiner) { cb.hook = f } }

// NewCombiner returns a Combiner for the local trust domain with the given
// default and no sources, and publishes that policy in cell at once (nil,
// no policy, for DefaultAllow).
func NewCombiner(local spiffeid.TrustDomain, def Default, cell *Cell, opts ...CombinerOption) (*Combiner, error) {
	if cell == nil {
		return nil, errors.New("trustpolicy: combiner without a cell")
	}
	c := &Combiner{local: local, cell: cell, clock: clock.RealClock{}, def: def}
	for _, o := range opts {
		o(c)
	}
	p, err := Compile(local, def, nil)
	if err != nil {
		return nil, err
	}
	if c.reg != nil {
		if c.metrics, err = newMetrics(c.reg); err != nil {
			return nil, fmt.Errorf("trustpolicy: %w", err)
		}
	}
	c.sources = rulesource.New[Rule, Default](c.clock, c.metrics)
	c.publish(p, "")
	return c, nil
}

// SetSource replaces the rules of source and republishes; on error the
// source's previous rules stay. The source's default, if its document set
// one, is kept. rules must not be modified afterwards.
func (c *Combiner) SetSource(source string, rules []Rule) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, def := c.sources.Rules(source)
	return c.setLocked(source, rules, def)
}

// SetSourceDocument is SetSource with the document's default too.
func (c *Combiner) SetSourceDocument(source string, doc Document) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if doc.Default != "" {
		if _, err := ParseDefault(string(doc.Default)); err != nil {
			return c.sources.Fail(source, fmt.Errorf("trustpolicy: %s: %w", source, err))
		}
	}
	return c.setLocked(source, doc.Rules, doc.Default)
}

// SetSourceError records that source could not be read (a missing or
// malformed file): its last good rules stay, the error shows in Status and
// the reload metric.
func (c *Combiner) SetSourceError(source string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.sources.Fail(source, err)
}

// RemoveSource drops source and its rules (a deleted resource, a file no
// longer configured).
func (c *Combiner) RemoveSource(source string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.sources.Remove(source) {
		return
	}
	p, err := c.compileLocked("", nil, "")
	if err != nil {
		// Every remaining source compiled together before; fewer rules
		// cannot fail. Keep the current policy if it somehow does.
		return
	}
	c.publish(p, source)
}

// SetDefault changes the Combiner's own default and republishes.
func (c *Combiner) SetDefault(def Default) error {
	if _, err := ParseDefault(string(def)); err != nil {
		return fmt.Errorf("trustpolicy: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.def
	c.def = def
	p, err := c.compileLocked("", nil, "")
	if err != nil {
		c.def = old
		return err
	}
	c.publish(p, "")
	return nil
}

func (c *Combiner) setLocked(source string, rules []Rule, def Default) error {
	if source == "" {
		return errors.New("trustpolicy: a policy source needs a name")
	}
	// The same rules again (a resync, a file restored after an error)
	// change nothing in force: clear the error, wake nobody.
	if c.sources.Unchanged(source, rules, def) {
		return nil
	}
	p, err := c.compileLocked(source, rules, def)
	if err != nil {
		return c.sources.Fail(source, err)
	}
	c.sources.Set(source, rules, def)
	c.publish(p, source)
	return nil
}

// compileLocked compiles every source's rules, with source's replaced by
// rules and def, in source order (sorted by name: the order of the
// combined rules, and so of Decision.Matched, is stable).
// Errors name the source and the rule.
func (c *Combiner) compileLocked(source string, rules []Rule, def Default) (*Policy, error) {
	names := make(map[string]string)
	all := make([]Rule, 0, len(rules))
	effective := c.def
	for _, name := range c.sources.Names(source) {
		rs, d := rules, def
		if name != source {
			rs, d = c.sources.Rules(name)
		}
		if d == DefaultDeny {
			effective = DefaultDeny
		}
		for _, r := range rs {
			if prev, dup := names[r.Name]; dup {
				return nil, fmt.Errorf("trustpolicy: rule %q (%s) and rule %q (%s) have the same name; rule names must be unique across the policy file, --config and ClusterTrustPolicy resources", r.Name, r.Origin, r.Name, prev)
			}
			names[r.Name] = r.Origin
			all = append(all, r)
		}
	}
	for _, r := range rules {
		if _, err := compileRule(c.local, r); err != nil {
			return nil, fmt.Errorf("trustpolicy: %s: rule %q (%s): %w", source, r.Name, r.Origin, err)
		}
	}
	return Compile(c.local, effective, all)
}

// publish makes p current. The Cell gets nil for a policy without rules
// under DefaultAllow: no policy, today's behaviour, and a zero Decision
// whose Key is "".
func (c *Combiner) publish(p *Policy, source string) {
	prev := c.current
	c.current = p
	cellPolicy := p
	if p.Empty() && p.Default() == DefaultAllow {
		cellPolicy = nil
	}
	if cur, _ := c.cell.Load(); !samePolicy(cur, cellPolicy) {
		c.cell.Set(cellPolicy)
	}
	if c.hook != nil {
		c.hook(Publish{Source: source, Policy: p, Previous: prev})
	}
}

// samePolicy reports whether a and b hold the same rules, origins
// included, and default: publishing b in place of a would wake every SDS
// stream for nothing (a source read again with nothing new).
func samePolicy(a, b *Policy) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.local == b.local && a.def == b.def && reflect.DeepEqual(a.Rules(), b.Rules())
}

// Policy is the current combined policy, compiled even when it has no
// rules (the Cell holds nil then).
func (c *Combiner) Policy() *Policy {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.current
}

// Conflicts are the current policy's conflicts (see Policy.Conflicts).
func (c *Combiner) Conflicts() []Conflict { return c.Policy().Conflicts() }

// ConflictsOf are the current policy's conflicts of rule (see
// Policy.ConflictsOf).
func (c *Combiner) ConflictsOf(rule string) []Conflict { return c.Policy().ConflictsOf(rule) }

// Statuses returns every source's status, sorted by source.
func (c *Combiner) Statuses() []Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sources.Statuses()
}
