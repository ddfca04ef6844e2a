package rulesource

import (
	"cmp"
	"reflect"
	"slices"

	"k8s.io/utils/clock"
)

// Status is what one source last did, for status pages, metrics and the
// audit log.
type Status struct {
	Source      string `json:"source"` // "file:<path>", "config:<path>", "crd"
	Rules       int    `json:"rules"`
	LastError   string `json:"lastError,omitempty"` // "" when the last load succeeded
	LastSuccess int64  `json:"lastSuccess"`         // unix seconds; 0 never
}

// Sources holds every source's last good rules (of type R) and default
// (of type D, zero when its document set none). It is not safe for
// concurrent use: the combiner's lock guards it, as the compile that
// decides between Set and Fail must see the same sources.
type Sources[R any, D comparable] struct {
	clock   clock.PassiveClock
	metrics *Metrics
	states  map[string]*state[R, D]
}

type state[R any, D comparable] struct {
	rules  []R
	def    D
	status Status
}

// New returns Sources with none, recording LastSuccess by clk and every
// load in m (nil records nothing).
func New[R any, D comparable](clk clock.PassiveClock, m *Metrics) *Sources[R, D] {
	return &Sources[R, D]{clock: clk, metrics: m, states: make(map[string]*state[R, D])}
}

// Rules are source's last good rules and default; none for a source
// never loaded.
func (s *Sources[R, D]) Rules(source string) ([]R, D) {
	if st := s.states[source]; st != nil {
		return st.rules, st.def
	}
	var zero D
	return nil, zero
}

// Unchanged reports whether rules and def are source's last good ones
// (a resync, a file restored after an error); if so it records a
// success, which clears the error, and the caller has nothing to
// republish.
func (s *Sources[R, D]) Unchanged(source string, rules []R, def D) bool {
	st := s.states[source]
	if st == nil || st.def != def || !reflect.DeepEqual(st.rules, rules) {
		return false
	}
	s.succeeded(st)
	return true
}

// Set makes rules (copied) and def source's last good ones and records a
// success.
func (s *Sources[R, D]) Set(source string, rules []R, def D) {
	st := s.state(source)
	st.rules, st.def = slices.Clone(rules), def
	s.succeeded(st)
}

// Fail records that source's new rules were refused or could not be
// read: its last good rules stay. A source that never loaded is listed
// from then on, with no rules. It returns err.
func (s *Sources[R, D]) Fail(source string, err error) error {
	st := s.state(source)
	if st.status.LastError == err.Error() {
		// The same refusal again (a file polled while another source's
		// rule still clashes with it): a persisting problem counts once.
		return err
	}
	st.status.LastError = err.Error()
	s.metrics.reloaded(st.status, false)
	return err
}

// Remove drops source, its rules and its metrics; false if there was no
// such source.
func (s *Sources[R, D]) Remove(source string) bool {
	if _, ok := s.states[source]; !ok {
		return false
	}
	delete(s.states, source)
	s.metrics.remove(source)
	return true
}

// Names is every source plus extra (if not ""), sorted: the order in
// which to combine their rules, so that it is stable.
func (s *Sources[R, D]) Names(extra string) []string {
	names := make([]string, 0, len(s.states)+1)
	for name := range s.states {
		names = append(names, name)
	}
	if _, ok := s.states[extra]; extra != "" && !ok {
		names = append(names, extra)
	}
	slices.Sort(names)
	return names
}

// Statuses returns every source's status, sorted by source.
func (s *Sources[R, D]) Statuses() []Status {
	out := make([]Status, 0, len(s.states))
	for _, st := range s.states {
		out = append(out, st.status)
	}
	slices.SortFunc(out, func(a, b Status) int { return cmp.Compare(a.Source, b.Source) })
	return out
}

func (s *Sources[R, D]) state(source string) *state[R, D] {
	st := s.states[source]
	if st == nil {
		st = &state[R, D]{status: Status{Source: source}}
		s.states[source] = st
	}
	return st
}

func (s *Sources[R, D]) succeeded(st *state[R, D]) {
	st.status.Rules = len(st.rules)
	st.status.LastError = ""
	st.status.LastSuccess = s.clock.Now().Unix()
	s.metrics.reloaded(st.status, true)
}
