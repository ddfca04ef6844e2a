package ca

import (
	"context"
	"crypto/x509"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// syncPlugin publishes the plug-in directory's roots, bumping the
// sequence when the set changed, and persists it.
func (a *Authority) syncPlugin() error { return a.syncPluginWith(false) }

// syncPluginWith is syncPlugin, also preparing a JWT key when forceJWT
// (rotateJWTKey). The request lives only as long as this call, which
// reports its outcome: a failed one leaves nothing pending, as in
// self-signed mode, rather than rotating later when nobody asks.
func (a *Authority) syncPluginWith(forceJWT bool) error {
	unlock, err := a.lockState()
	if err != nil {
		return err
	}
	defer unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	j, keys, version, err := a.loadPluginJournalLocked()
	if err != nil {
		return err
	}
	// JWT keys are the CA's own in plug-in mode too (the directory has
	// X.509 material only); they rotate here as in self-signed mode. Until
	// the commit succeeds, SignJWT, Sequence and the next sync keep the
	// journal and keys last published.
	prevJournal, prevKeys := a.journal, a.jwtKeys
	a.journal, a.jwtKeys = j, keys
	m := a.cfg.Plugin.current()
	stored := j.Sequence
	jwtChanged, err := a.jwtStepsLocked(forceJWT)
	if err == nil {
		version, err = a.commitPluginRootsLocked(a.cfg.Clock.Now(), m, version, jwtChanged, stored)
	}
	if err != nil {
		a.journal, a.jwtKeys = prevJournal, prevKeys
		return err
	}
	a.version = version
	a.floored = true
	a.retirePluginSignerLocked(a.cfg.Clock.Now(), m)
	a.plugin = m
	if err := a.setPluginRootsLocked(j.PluginRoots); err != nil {
		return err
	}
	a.publishLocked()
	return nil
}

// loadPluginJournalLocked reads the journal a plug-in CA publishes from,
// refusing state that holds self-signed roots.
func (a *Authority) loadPluginJournalLocked() (*castate.Journal, []*castate.JWTKey, string, error) {
	j, roots, keys, version, err := a.backend.Load(a.cfg.TrustDomain.Name())
	if err != nil {
		return nil, nil, "", err
	}
	if len(roots) > 0 {
		return nil, nil, "", fmt.Errorf("ca: %s holds self-signed roots; switching to --ca-dir would drop them from the bundle while certificates they signed are still in use; use a fresh --data-dir", a.backend.Describe())
	}
	if j == nil {
		j = &castate.Journal{TrustDomain: a.cfg.TrustDomain.Name()}
	}
	return j, keys, version, nil
}

// commitPluginRootsLocked records m's roots and a.jwtKeys in a.journal
// and persists it when the published set changed (or nothing was ever
// published), and returns the state's version, new or as it was. stored
// is the sequence as loaded: a JWT key change may have moved it already.
func (a *Authority) commitPluginRootsLocked(now time.Time, m *PluginMaterial, version string, jwtChanged bool, stored uint64) (string, error) {
	j := a.journal
	recs, changed := a.pluginRecords(now, m, j.PluginRoots)
	if !changed && !jwtChanged && j.Sequence != 0 && a.floored {
		return version, nil
	}
	prev := j.Sequence
	j.PluginRoots = recs
	// A change, or this process's first write (sequence.go, rule 2).
	if j.Sequence == stored {
		j.Sequence = nextSequence(prev, now)
	}
	j.Updated = now
	if changed || prev == 0 {
		ids := make([]string, 0, len(recs))
		for _, r := range recs {
			ids = append(ids, r.SHA256)
		}
		j.Events = append(j.Events, castate.JournalNote{At: now, Event: "plug-in roots changed", RootID: strings.Join(ids, ",")})
		a.metrics.rotations.WithLabelValues("plugin_change").Inc()
		a.cfg.Logger.Info("plug-in CA roots published", logattr.Roots, len(recs), logattr.Sequence, j.Sequence)
	} else if !a.floored {
		a.cfg.Logger.Info("CA state loaded; publishing it with a new sequence, above anything published before this start",
			logattr.OldSequence, prev, logattr.Sequence, j.Sequence)
	}
	a.recordJWTKeysLocked()
	st := a.settings()
	j.Settings = &st
	version, err := a.backend.Commit(version, j, nil, a.jwtKeys)
	if err == nil {
		a.markJWTServedLocked()
	}
	return version, err
}

// setPluginRootsLocked makes a.roots the journal's plug-in roots: external,
// or retired once they left the directory.
func (a *Authority) setPluginRootsLocked(recs []castate.PluginRootRecord) error {
	a.roots = a.roots[:0]
	for _, rec := range recs {
		cert, err := x509.ParseCertificate(rec.DER)
		if err != nil {
			return fmt.Errorf("ca: journal plug-in root %s: %w", rec.SHA256, err)
		}
		state := castate.StateExternal
		if !rec.RemoveAfter.IsZero() {
			state = castate.StateRetired
		}
		a.roots = append(a.roots, &castate.Root{RootRecord: castate.RootRecord{
			ID: cert.SerialNumber.Text(16), State: state, CertSHA256: rec.SHA256, RemoveAfter: rec.RemoveAfter,
		}, Cert: cert})
	}
	return nil
}

// pluginRecords computes the plug-in roots to publish: those of the
// directory, plus earlier ones that left it, kept (as retired) until every
// leaf they could have signed has expired. changed reports whether the
// published set differs from prev.
func (a *Authority) pluginRecords(now time.Time, m *PluginMaterial, prev []castate.PluginRootRecord) ([]castate.PluginRootRecord, bool) {
	current := map[string]bool{}
	var recs []castate.PluginRootRecord
	for _, r := range m.Roots {
		fp := fingerprint(r)
		current[fp] = true
		recs = append(recs, castate.PluginRootRecord{SHA256: fp, DER: r.Raw})
	}
	removeAfter := now.Add(retireMargin + a.timelineLocked().MaxWorkloadTTL)
	for _, p := range prev {
		if current[p.SHA256] {
			continue
		}
		if p.RemoveAfter.IsZero() {
			p.RemoveAfter = removeAfter
		}
		if now.Before(p.RemoveAfter) {
			recs = append(recs, p)
		}
	}
	key := func(rs []castate.PluginRootRecord) string {
		ids := make([]string, len(rs))
		for i, r := range rs {
			ids[i] = r.SHA256
		}
		sort.Strings(ids)
		return strings.Join(ids, ",")
	}
	return recs, key(recs) != key(prev)
}

// nextPluginRemoval is when the next retired plug-in root leaves the
// bundle or a JWT key step is due, or zero.
func (a *Authority) nextPluginRemoval() time.Time {
	a.mu.RLock()
	defer a.mu.RUnlock()
	next := a.nextJWTStepLocked(a.cfg.Clock.Now())
	for _, r := range a.roots {
		if r.State == castate.StateRetired {
			next = earliest(next, r.RemoveAfter)
		}
	}
	return next
}

func (a *Authority) runPlugin(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- a.cfg.Plugin.run(ctx) }()
	// checked is when the last sync here started; New's is not known, so
	// work due at the start is done at once.
	var checked time.Time
	for {
		// Wake up for a directory change, when a retired plug-in root is
		// due to leave the bundle or a JWT key step is due, and at least
		// every recheckInterval: a step that failed is retried, and a key
		// `ca rotate --jwt` wrote into the state is published.
		now := a.cfg.Clock.Now()
		timer := a.cfg.Clock.NewTimer(retryBy(now, checked, a.nextPluginRemoval()).Sub(now))
		select {
		case <-ctx.Done():
			timer.Stop()
			return <-done
		case <-timer.C():
		case <-a.cfg.Plugin.changes():
		case <-a.kick:
			// The directory is the plug-in CA's state and its watcher
			// follows it: a recheck only wakes the subscribers.
			timer.Stop()
			a.wakeSubscribers()
			continue
		}
		timer.Stop()
		checked = a.cfg.Clock.Now()
		a.recordCheck(a.syncPlugin(), "could not publish new plug-in CA roots; keeping the previous bundle and material")
	}
}

// Plugin is the plug-in CA directory's watcher, nil without one: cmd
// re-reads it on SIGHUP (PluginWatcher.Check) instead of waiting for its
// next poll.
func (a *Authority) Plugin() *PluginWatcher { return a.cfg.Plugin }
