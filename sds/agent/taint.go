package agent

import (
	"crypto/x509"
	"encoding/hex"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/loop"
)

// taintSet is the tainted authorities the server named last (issue 38:
// "taint means re-issue now") and the window over which their
// credentials are re-issued. gen tells one set from the next; the zero
// set taints nothing.
type taintSet struct {
	authorities []caclient.TaintedAuthority
	spread      time.Duration
	gen         uint64
}

// signed tells whether chain (leaf first) was signed by an authority of s.
func (s *taintSet) signed(chain []*x509.Certificate) bool {
	return s != nil && caclient.SignedBy(chain, s.authorities)
}

// taintFollower is told of every new taint set and answers how many of
// the credentials it holds the set taints, for the one log line a change
// makes. It must not call back into the cell.
type taintFollower func(taintSet) int

// taintCell holds the taint set in force. Every WatchBundles stream of
// the agent (one per workload identity on a node) carries the CA's one
// set, so a message only changes the cell when the set differs from the
// last; each change reaches every follower once, in order.
type taintCell struct {
	mu        sync.Mutex
	cur       taintSet
	key       string
	lastErr   string
	followers []taintFollower
}

// follow adds f; it is told of the set in force at once when there is one.
func (c *taintCell) follow(f taintFollower) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.followers = append(c.followers, f)
	if c.cur.gen != 0 {
		f(c.cur)
	}
}

// get is the set in force.
func (c *taintCell) get() taintSet {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// take sets the taints a WatchBundles message names. Entries caclient
// could not read are said once per distinct problem (log may be nil);
// the others are taken.
func (c *taintCell) take(b *caclient.Bundles, log *slog.Logger) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sayErr(b.TaintedErr, log)
	key := taintKey(b.Tainted, b.ReissueSpread)
	if key == c.key {
		return
	}
	c.key = key
	c.cur = taintSet{authorities: b.Tainted, spread: b.ReissueSpread, gen: c.cur.gen + 1}
	scheduled := 0
	for _, f := range c.followers {
		scheduled += f(c.cur)
	}
	switch {
	case log == nil:
	case len(b.Tainted) == 0:
		log.Info("the server names no tainted authority any more")
	default:
		log.Warn("the server's tainted authorities changed; re-issuing what they signed", "tainted", len(b.Tainted),
			"credentials", scheduled, "spread", b.ReissueSpread)
	}
}

// sayErr logs err once per distinct text. c.mu is held.
func (c *taintCell) sayErr(err error, log *slog.Logger) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg == c.lastErr {
		return
	}
	c.lastErr = msg
	if msg != "" && log != nil {
		log.Warn("the server names tainted authorities this agent cannot read; acting on the others", logattr.Error, msg)
	}
}

// taintKey is a set's identity: equal sets, equal keys; "" for no
// taints, whatever the spread, as the cell starts.
func taintKey(ts []caclient.TaintedAuthority, spread time.Duration) string {
	if len(ts) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(strconv.FormatInt(int64(spread), 10))
	for _, t := range ts {
		b.WriteString("|" + hex.EncodeToString(t.X509SubjectKeyID) + "/" + hex.EncodeToString(t.X509SHA256) + "/" + strconv.Quote(t.JWTKeyID))
	}
	return b.String()
}

// taintDelay is when, after a taint arrived, to re-issue one credential
// it taints: uniformly in [0, spread) as r is in [0, 1), so that every
// workload of a cluster does not reach the CA in the same second. A
// spread of zero or less means at once.
func taintDelay(spread time.Duration, r float64) time.Duration {
	if spread <= 0 || !(r > 0) {
		return 0
	}
	d := time.Duration(float64(spread) * r)
	return min(d, spread-1)
}

// taintDue is one credential's re-issuance that taints ask for.
type taintDue struct {
	// gen is the taint set the credential was last judged against.
	gen uint64
	// at is when the re-issue is due; zero when none is.
	at time.Time
	// pending is set while a re-issue for a taint is under way (it may
	// fail and be retried as a renewal is), until one succeeds.
	pending bool
	// tainted counts the re-issues in a row that came back signed by a
	// tainted authority.
	tainted int
}

// onSet judges chain against set, once per set: a tainted credential is
// due at a random point of the spread (r in [0, 1)); one the new set does
// not taint is due no more. It reports whether it scheduled a re-issue.
func (d *taintDue) onSet(chain []*x509.Certificate, set taintSet, now time.Time, r float64) bool {
	if set.gen == d.gen {
		return false
	}
	d.gen = set.gen
	if !set.signed(chain) {
		d.at = time.Time{}
		return false
	}
	d.at, d.tainted = now.Add(taintDelay(set.spread, r)), 0
	return true
}

// onIssued judges a chain just issued, and reports whether it ended a
// re-issue a taint asked for. One still signed by a tainted authority
// (the CA has not switched yet) is served, as it is no worse than the
// last, and re-issued again after a backoff rather than in a tight loop.
func (d *taintDue) onIssued(chain []*x509.Certificate, set taintSet, now time.Time, retry loop.Backoff, r float64) bool {
	reissued := d.pending
	d.pending, d.gen = false, set.gen
	if !set.signed(chain) {
		d.at, d.tainted = time.Time{}, 0
		return reissued
	}
	d.tainted++
	d.at = now.Add(retry.Delay(d.tainted, r))
	return reissued
}

// take reports whether the re-issue is due at now, and marks it under
// way: a failure is retried as a renewal's is, not from here.
func (d *taintDue) take(now time.Time) bool {
	if d.at.IsZero() || now.Before(d.at) {
		return false
	}
	d.at, d.pending = time.Time{}, true
	return true
}

// wake is the earlier of next and the re-issue's time, if one is due.
func (d *taintDue) wake(next time.Time) time.Time {
	if !d.at.IsZero() && d.at.Before(next) {
		return d.at
	}
	return next
}
