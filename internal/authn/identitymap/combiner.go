package identitymap

import (
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/fileutil/rulesource"
)

// Status is what one identity map source last did, for the status page,
// metrics and the audit log.
type Status = rulesource.Status

// Combiner merges the rules of every source (the file, later the
// IdentityMapping resources) into one Map and publishes it in a Cell. A
// source whose new rules do not compile keeps its last good rules; the
// error is in Status and the reload metric.
//
// Rule names are unique across sources. The default is the strictest of
// the Combiner's own (Config.Default) and those the sources' documents
// set: none if any says none, so that a file cannot quietly give
// identities the operator's configuration withholds.
type Combiner struct {
	cfg     Config
	cell    *Cell
	clock   clock.PassiveClock
	reg     prometheus.Registerer
	metrics *metrics

	mu      sync.Mutex
	sources *rulesource.Sources[Rule, Default]
	current *Map
}

// CombinerOption configures a Combiner.
type CombinerOption func(*Combiner)

// WithClock sets the clock of Status.LastSuccess and the reload metrics.
func WithClock(c clock.PassiveClock) CombinerOption { return func(cb *Combiner) { cb.clock = c } }

// WithRegisterer registers the identity map metrics (reloads, rules and
// last success by source, conflicts) on reg.
func WithRegisterer(reg prometheus.Registerer) CombinerOption {
	return func(cb *Combiner) { cb.reg = reg }
}

// NewCombiner returns a Combiner with no sources and publishes that map
// (the default alone) in cell at once.
func NewCombiner(cfg Config, cell *Cell, opts ...CombinerOption) (*Combiner, error) {
	if cell == nil {
		return nil, errors.New("identitymap: combiner without a cell")
	}
	c := &Combiner{cfg: cfg, cell: cell, clock: clock.RealClock{}}
	for _, o := range opts {
		o(c)
	}
	m, err := Compile(cfg, nil)
	if err != nil {
		return nil, err
	}
	if c.reg != nil {
		if c.metrics, err = newMetrics(c.reg); err != nil {
			return nil, fmt.Errorf("identitymap: %w", err)
		}
	}
	c.sources = rulesource.New[Rule, Default](c.clock, c.metrics.sources())
	c.publish(m)
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
			return c.sources.Fail(source, fmt.Errorf("identitymap: %s: %w", source, err))
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

// RemoveSource drops source and its rules (a file no longer configured).
func (c *Combiner) RemoveSource(source string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.sources.Remove(source) {
		return
	}
	if m, err := c.compileLocked("", nil, ""); err == nil {
		// Fewer rules that compiled together before cannot fail; keep the
		// current map if they somehow do.
		c.publish(m)
	}
}

func (c *Combiner) setLocked(source string, rules []Rule, def Default) error {
	if source == "" {
		return errors.New("identitymap: a source needs a name")
	}
	// The same rules again (a resync, a file restored after an error)
	// change nothing in force: clear the error, wake nobody.
	if c.sources.Unchanged(source, rules, def) {
		return nil
	}
	m, err := c.compileLocked(source, rules, def)
	if err != nil {
		return c.sources.Fail(source, err)
	}
	c.sources.Set(source, rules, def)
	c.publish(m)
	return nil
}

// compileLocked compiles every source's rules, with source's replaced by
// rules and def, in source order (sorted by name: the order of the
// combined rules, and so of Identity.Rules, is stable).
// Errors name the source and the rule.
func (c *Combiner) compileLocked(source string, rules []Rule, def Default) (*Map, error) {
	names := make(map[string]string)
	var all []Rule
	cfg := c.cfg
	for _, name := range c.sources.Names(source) {
		rs, d := rules, def
		if name != source {
			rs, d = c.sources.Rules(name)
		}
		if d == DefaultNone {
			cfg.Default = DefaultNone
		}
		for _, r := range rs {
			if prev, dup := names[r.Name]; dup {
				return nil, fmt.Errorf("identitymap: rule %q (%s) and rule %q (%s) have the same name; rule names must be unique across the identity map file and IdentityMapping resources", r.Name, r.Origin, r.Name, prev)
			}
			names[r.Name] = r.Origin
			all = append(all, r)
		}
	}
	// Compile's errors name the rule's origin, and so its source.
	return Compile(cfg, all)
}

// publish makes m current, and puts it in the Cell unless the Cell holds
// the same rules already (a source read again with nothing new).
func (c *Combiner) publish(m *Map) {
	c.current = m
	if cur := c.cell.Load(); cur == nil || cur.cfg != m.cfg || !reflect.DeepEqual(cur.Rules(), m.Rules()) {
		c.cell.Set(m)
	}
	c.metrics.published(m)
}

// Map is the current combined map.
func (c *Combiner) Map() *Map {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.current
}

// Conflicts are the current map's conflicts (see Map.Conflicts).
func (c *Combiner) Conflicts() []Conflict { return c.Map().Conflicts() }

// ConflictsOf are the current map's conflicts of rule (see
// Map.ConflictsOf): an IdentityMapping resource's status.
func (c *Combiner) ConflictsOf(rule string) []Conflict { return c.Map().ConflictsOf(rule) }

// Statuses returns every source's status, sorted by source.
func (c *Combiner) Statuses() []Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sources.Statuses()
}
