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
func (m *manager) syncPlugin() error { return m.syncPluginWith(false) }

// syncPluginWith is syncPlugin, also preparing a JWT key when forceJWT
// (rotateJWTKey). The request lives only as long as this call, which
// reports its outcome: a failed one leaves nothing pending, as in
// self-signed mode, rather than rotating later when nobody asks.
func (m *manager) syncPluginWith(forceJWT bool) error {
	unlock, err := m.lockState()
	if err != nil {
		return err
	}
	defer unlock()
	m.lockChange()
	defer m.unlockChange()
	j, keys, version, err := m.loadPluginJournalLocked()
	if err != nil {
		return err
	}
	// JWT keys are the CA's own in plug-in mode too (the directory has
	// X.509 material only); they rotate here as in self-signed mode. Until
	// the commit succeeds, SignJWT, Sequence and the next sync keep the
	// journal and keys last published.
	prevJournal, prevKeys := m.journal, m.jwtKeys
	m.journal, m.jwtKeys = j, keys
	pm := m.cfg.Plugin.current()
	stored := j.Sequence
	jwtChanged, err := m.jwtStepsLocked(forceJWT)
	if err == nil {
		version, err = m.commitPluginRootsLocked(m.cfg.Clock.Now(), pm, version, jwtChanged, stored)
	}
	if err != nil {
		m.journal, m.jwtKeys = prevJournal, prevKeys
		return err
	}
	m.version = version
	m.floored = true
	m.retirePluginSignerLocked(m.cfg.Clock.Now(), pm)
	m.plugin = pm
	if err := m.setPluginRootsLocked(j.PluginRoots); err != nil {
		return err
	}
	m.publishLocked()
	return nil
}

// loadPluginJournalLocked reads the journal a plug-in CA publishes from,
// refusing state that holds self-signed roots.
func (m *manager) loadPluginJournalLocked() (*castate.Journal, []*castate.JWTKey, string, error) {
	j, roots, keys, version, err := m.backend.Load(m.cfg.TrustDomain.Name())
	if err != nil {
		return nil, nil, "", err
	}
	if len(roots) > 0 {
		return nil, nil, "", fmt.Errorf("ca: %s holds self-signed roots; switching to --ca-dir would drop them from the bundle while certificates they signed are still in use; use a fresh --data-dir", m.backend.Describe())
	}
	if j == nil {
		j = &castate.Journal{TrustDomain: m.cfg.TrustDomain.Name()}
	}
	return j, keys, version, nil
}

// commitPluginRootsLocked records pm's roots and m.jwtKeys in m.journal
// and persists it when the published set changed (or nothing was ever
// published), and returns the state's version, new or as it was. stored
// is the sequence as loaded: a JWT key change may have moved it already.
func (m *manager) commitPluginRootsLocked(now time.Time, pm *PluginMaterial, version string, jwtChanged bool, stored uint64) (string, error) {
	j := m.journal
	recs, changed := m.pluginRecords(now, pm, j.PluginRoots)
	if !changed && !jwtChanged && j.Sequence != 0 && m.floored {
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
		m.metrics.rotations.WithLabelValues("plugin_change").Inc()
		m.cfg.Logger.Info("plug-in CA roots published", logattr.Roots, len(recs), logattr.Sequence, j.Sequence)
	} else if !m.floored {
		m.cfg.Logger.Info("CA state loaded; publishing it with a new sequence, above anything published before this start",
			logattr.OldSequence, prev, logattr.Sequence, j.Sequence)
	}
	m.recordJWTKeysLocked()
	st := m.settings()
	j.Settings = &st
	version, err := m.backend.Commit(version, j, nil, m.jwtKeys)
	if err == nil {
		m.markJWTServedLocked()
	}
	return version, err
}

// setPluginRootsLocked makes m.roots the journal's plug-in roots: external,
// or retired once they left the directory.
func (m *manager) setPluginRootsLocked(recs []castate.PluginRootRecord) error {
	m.roots = m.roots[:0]
	for _, rec := range recs {
		cert, err := x509.ParseCertificate(rec.DER)
		if err != nil {
			return fmt.Errorf("ca: journal plug-in root %s: %w", rec.SHA256, err)
		}
		state := castate.StateExternal
		if !rec.RemoveAfter.IsZero() {
			state = castate.StateRetired
		}
		m.roots = append(m.roots, &castate.Root{RootRecord: castate.RootRecord{
			ID: cert.SerialNumber.Text(16), State: state, CertSHA256: rec.SHA256, RemoveAfter: rec.RemoveAfter,
		}, Cert: cert})
	}
	return nil
}

// pluginRecords computes the plug-in roots to publish: those of the
// directory, plus earlier ones that left it, kept (as retired) until every
// leaf they could have signed has expired. changed reports whether the
// published set differs from prev.
func (m *manager) pluginRecords(now time.Time, pm *PluginMaterial, prev []castate.PluginRootRecord) ([]castate.PluginRootRecord, bool) {
	current := map[string]bool{}
	var recs []castate.PluginRootRecord
	for _, r := range pm.Roots {
		fp := fingerprint(r)
		current[fp] = true
		recs = append(recs, castate.PluginRootRecord{SHA256: fp, DER: r.Raw})
	}
	removeAfter := now.Add(retireMargin + m.timelineLocked().MaxWorkloadTTL)
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
func (m *manager) nextPluginRemoval() time.Time {
	m.mu.RLock()
	defer m.mu.RUnlock()
	next := m.nextJWTStepLocked(m.cfg.Clock.Now())
	for _, r := range m.roots {
		if r.State == castate.StateRetired {
			next = earliest(next, r.RemoveAfter)
		}
	}
	return next
}

func (m *manager) runPlugin(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- m.cfg.Plugin.run(ctx) }()
	// checked is when the last sync here started; New's is not known, so
	// work due at the start is done at once.
	var checked time.Time
	for {
		// Wake up for a directory change, when a retired plug-in root is
		// due to leave the bundle or a JWT key step is due, and at least
		// every recheckInterval: a step that failed is retried, and a key
		// `ca rotate --jwt` wrote into the state is published.
		now := m.cfg.Clock.Now()
		timer := m.cfg.Clock.NewTimer(retryBy(now, checked, m.nextPluginRemoval()).Sub(now))
		select {
		case <-ctx.Done():
			timer.Stop()
			return <-done
		case <-timer.C():
		case <-m.cfg.Plugin.changes():
		case <-m.kick:
			// The directory is the plug-in CA's state and its watcher
			// follows it: a recheck only wakes the subscribers.
			timer.Stop()
			m.wakeSubscribers()
			continue
		}
		timer.Stop()
		checked = m.cfg.Clock.Now()
		m.recordCheck(m.syncPlugin(), "could not publish new plug-in CA roots; keeping the previous bundle and material")
	}
}

// retirePluginSignerLocked remembers the plug-in CA certificate in use
// when next replaces it, and forgets those whose leaves have all expired.
func (m *manager) retirePluginSignerLocked(now time.Time, next *PluginMaterial) {
	kept := m.pluginSigners[:0]
	for _, s := range m.pluginSigners {
		if now.Before(s.until) {
			kept = append(kept, s)
		}
	}
	m.pluginSigners = kept
	prev := m.plugin
	if prev == nil || prev.Cert == nil || (next != nil && next.Cert.Equal(prev.Cert)) {
		return
	}
	// Every leaf was clamped to the signing certificate's own expiry and
	// to MaxWorkloadTTL, and signed at a time before now (see board).
	until := minTime(prev.Cert.NotAfter, now.Add(retireMargin+m.timelineLocked().MaxWorkloadTTL))
	m.pluginSigners = append(m.pluginSigners, pluginSigner{cert: prev.Cert, until: until})
}
