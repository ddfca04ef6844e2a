package ca

import (
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// Defaults for the JWT fields of Config.
const (
	defaultJWTKeyType    = JWTKeyES256
	defaultJWTKeyTTL     = 720 * time.Hour
	defaultJWTSVIDTTL    = 5 * time.Minute
	defaultMaxJWTSVIDTTL = time.Hour
)

func (c *Config) applyJWTDefaults() error {
	if c.JWTKeyType == "" {
		c.JWTKeyType = defaultJWTKeyType
	}
	if _, err := ParseJWTKeyType(string(c.JWTKeyType)); err != nil {
		return err
	}
	if c.JWTKeyTTL < 0 || c.JWTSVIDTTL < 0 || c.MaxJWTSVIDTTL < 0 {
		return errors.New("JWT key TTL, JWT-SVID TTL and maximum JWT-SVID TTL must not be negative")
	}
	if c.JWTKeyTTL == 0 {
		c.JWTKeyTTL = defaultJWTKeyTTL
	}
	if c.MaxJWTSVIDTTL == 0 {
		c.MaxJWTSVIDTTL = defaultMaxJWTSVIDTTL
	}
	if c.JWTSVIDTTL == 0 {
		c.JWTSVIDTTL = min(defaultJWTSVIDTTL, c.MaxJWTSVIDTTL)
	}
	// JWT times are whole seconds (NumericDate); see signJWT.
	if c.MaxJWTSVIDTTL < time.Second {
		return fmt.Errorf("maximum JWT-SVID TTL %s is under one second, the resolution of JWT times; use at least 1s", c.MaxJWTSVIDTTL)
	}
	if c.JWTSVIDTTL < time.Second {
		return fmt.Errorf("JWT-SVID TTL %s is under one second, the resolution of JWT times; use at least 1s", c.JWTSVIDTTL)
	}
	if c.JWTSVIDTTL > c.MaxJWTSVIDTTL {
		return fmt.Errorf("JWT-SVID TTL %s exceeds the maximum %s; lower the one or raise the other", c.JWTSVIDTTL, c.MaxJWTSVIDTTL)
	}
	if c.JWTIssuer != "" {
		if _, err := jwtsvid.ParseIssuer(c.JWTIssuer); err != nil {
			return fmt.Errorf("JWT issuer: %w", err)
		}
	}
	if need := PublishLead*c.RefreshHint + c.MaxJWTSVIDTTL; c.JWTKeyTTL/2 < need {
		return fmt.Errorf("JWT key TTL %s is too short: half of it must cover %d refresh hints (%s) plus the maximum JWT-SVID TTL (%s); use at least %s",
			c.JWTKeyTTL, PublishLead, PublishLead*c.RefreshHint, c.MaxJWTSVIDTTL, 2*need)
	}
	return nil
}

// jwtTimelineLocked is the JWT keys' timeline: a root's, with the longest
// JWT-SVID TTL ever recorded in place of the workload certificates'.
func (m *manager) jwtTimelineLocked() timeline {
	tl := timeline{RefreshHint: m.cfg.RefreshHint, MaxWorkloadTTL: m.cfg.MaxJWTSVIDTTL}
	if rec := time.Duration(m.journal.MaxJWTSVIDTTLSeconds) * time.Second; rec > tl.MaxWorkloadTTL {
		tl.MaxWorkloadTTL = rec
	}
	return tl
}

// maxJWTSVIDTTLLocked is the longest JWT-SVID this replica may mint: the
// configured maximum, lowered to the one the journal records when that is
// shorter. The leader removes a retired key once the recorded maximum has
// passed; a replica configured with a higher maximum than the leader's
// would otherwise mint tokens that outlive their key in the bundle.
func (m *manager) maxJWTSVIDTTLLocked() time.Duration {
	limit := m.cfg.MaxJWTSVIDTTL
	if rec := time.Duration(m.journal.MaxJWTSVIDTTLSeconds) * time.Second; rec > 0 && rec < limit {
		limit = rec
	}
	return limit
}

func (m *manager) jwtTimesLocked() []rootTimes {
	out := make([]rootTimes, len(m.jwtKeys))
	for i, k := range m.jwtKeys {
		out[i] = jwtKeyTimes(k)
	}
	return out
}

// served keys JWT keys apart from roots.
func jwtServedKey(kid string) string { return "jwt:" + kid }

// reconcileJWTLocked applies every JWT key step due now, and reports
// whether anything changed. A prepared key's publication lead starts when
// this process began serving it, as a root's (see served); one it has not
// served yet (plug-in mode publishes after this) starts now.
func (m *manager) reconcileJWTLocked() (bool, error) {
	changed := false
	now := m.cfg.Clock.Now()
	for _, k := range m.jwtKeys {
		if k.State != castate.StatePrepared {
			continue
		}
		s, ok := m.served[jwtServedKey(k.KID)]
		if !ok {
			s = now
		}
		if s.After(k.PublishedAt) {
			k.PublishedAt = s
			changed = true
		}
	}
	stepped, err := m.applyDue(m.jwtTimelineLocked, m.jwtTimesLocked, m.applyJWTLocked)
	return changed || stepped, err
}

func (m *manager) applyJWTLocked(now time.Time, step step, index int) error {
	switch step {
	case stepBootstrap:
		// No JWT key: a fresh CA, or state written before JWT keys
		// existed. A fresh CA's first key signs at once: no peer can hold
		// its bundle yet, so none can be missing the key. A CA whose
		// bundle peers already poll (roots from before this decision)
		// publishes its first key PublishLead hints before it signs, as
		// every successor does: a peer that has not refreshed would
		// otherwise refuse the first tokens (issue 17: keys are published
		// at least 5 refresh hints before first use). Plan activates it.
		if m.publishedBeforeLocked() {
			return m.newJWTKeyLocked(now, castate.StatePrepared, "first, upgraded CA")
		}
		return m.newJWTKeyLocked(now, castate.StateActive, "bootstrap")
	case stepPrepare:
		return m.newJWTKeyLocked(now, castate.StatePrepared, "scheduled")
	case stepActivate:
		for _, k := range m.jwtKeys {
			if k.State == castate.StateActive {
				k.State = castate.StateRetired
				k.RetiredAt = now
				k.RemoveAfter = m.jwtTimelineLocked().removeAfter(jwtKeyTimes(k), now.Add(retireMargin))
				m.jwtEvent(now, "retired", k.KID)
			}
		}
		p := m.jwtKeys[index]
		p.State = castate.StateActive
		p.ActivatedAt = now
		m.jwtEvent(now, "activated", p.KID)
		return nil
	case stepRemove:
		k := m.jwtKeys[index]
		m.jwtKeys = append(m.jwtKeys[:index:index], m.jwtKeys[index+1:]...)
		m.moveSequenceLocked(now)
		m.jwtEvent(now, "removed", k.KID)
		return nil
	}
	return fmt.Errorf("ca: unknown JWT key rotation step %v", step)
}

// publishedBeforeLocked says whether the journal, as loaded for this
// decision, holds roots: its bundle may be in peers' hands already. Roots
// this decision bootstrapped are not in it until the commit.
func (m *manager) publishedBeforeLocked() bool {
	return len(m.journal.Roots) > 0 || len(m.journal.PluginRoots) > 0
}

func (m *manager) newJWTKeyLocked(now time.Time, state castate.RootState, why string) error {
	k, err := m.newJWTKeyKeyed(now)
	if err != nil {
		return err
	}
	k.State, k.PublishedAt = state, now
	if state == castate.StatePrepared {
		k.MinActivateAt = now.Add(PublishLead * m.cfg.RefreshHint)
	} else {
		k.ActivatedAt = now
	}
	m.jwtKeys = append(m.jwtKeys, k)
	m.moveSequenceLocked(now)
	event := "prepared (" + why + ")"
	if state == castate.StateActive {
		event = "bootstrap"
	}
	m.jwtEvent(now, event, k.KID)
	return nil
}

// moveSequenceLocked moves the sequence for a change to the published
// JWT keys, unless this decision moved it already: a sequence above the
// published bundle's is new to peers whatever else changes with it, and a
// fresh CA's first bundle carries its bootstrap time.
func (m *manager) moveSequenceLocked(now time.Time) {
	if pub, _ := m.bundle.SequenceNumber(); m.journal.Sequence > pub {
		return
	}
	m.journal.Sequence = nextSequence(m.journal.Sequence, now)
}

func (m *manager) jwtEvent(now time.Time, what, kid string) {
	m.journal.Events = append(m.journal.Events, castate.JournalNote{At: now, Event: "JWT key " + what, KID: kid})
	m.metrics.jwtEvents.WithLabelValues(firstWord(what)).Inc()
	m.cfg.Logger.Info("CA JWT key "+what, logattr.KeyID, kid, logattr.Sequence, m.journal.Sequence)
}

// recordJWTKeysLocked copies the JWT keys' records into the journal
// before a commit, with the largest maximum JWT-SVID TTL ever used.
func (m *manager) recordJWTKeysLocked() {
	m.journal.JWTKeys = m.journal.JWTKeys[:0]
	for _, k := range m.jwtKeys {
		m.journal.JWTKeys = append(m.journal.JWTKeys, k.JWTKeyRecord)
	}
	if s := int64(m.cfg.MaxJWTSVIDTTL / time.Second); s > m.journal.MaxJWTSVIDTTLSeconds {
		m.journal.MaxJWTSVIDTTLSeconds = s
	}
}

// markJWTServedLocked notes, after a commit, that the keys it publishes
// were published when decided (as commitLocked does for roots).
func (m *manager) markJWTServedLocked() {
	for _, k := range m.jwtKeys {
		if _, ok := m.served[jwtServedKey(k.KID)]; !ok && !k.PublishedAt.IsZero() {
			m.served[jwtServedKey(k.KID)] = k.PublishedAt
		}
	}
}

// publishJWTLocked adds the JWT keys to b and notes when this process
// first served each; current collects the served keys in use.
func (m *manager) publishJWTLocked(b *spiffebundle.Bundle, now time.Time, current map[string]bool) {
	for _, k := range m.jwtKeys {
		if err := b.AddJWTAuthority(k.KID, k.Key.Public()); err != nil {
			// Only an empty kid fails, which DecodeJournal refuses.
			m.cfg.Logger.Error("CA JWT key not published", logattr.KeyID, k.KID, logattr.Error, err)
			continue
		}
		key := jwtServedKey(k.KID)
		current[key] = true
		if _, ok := m.served[key]; !ok {
			m.served[key] = now
		}
	}
}

// rotateJWTKey publishes a successor JWT key now, unless one is already
// waiting; it signs only after the usual publication lead. Rotate leaves
// JWT keys alone and this leaves roots alone: the two are separate keys,
// and replacing one (a suspected compromise) need not churn the other.
func (m *manager) rotateJWTKey() error {
	if !m.leading() {
		return fmt.Errorf("ca: %w: only the leader rotates JWT keys", castate.ErrNotLeader)
	}
	if m.cfg.Plugin != nil {
		return m.rotateJWTKeyPlugin()
	}
	return m.withStateLocked(func() error {
		if !m.prepareJWTKeyNowLocked() {
			return nil
		}
		if err := m.newJWTKeyLocked(m.cfg.Clock.Now(), castate.StatePrepared, "forced"); err != nil {
			return err
		}
		return m.commitLocked()
	})
}

// prepareJWTKeyNowLocked says whether a forced rotation has anything to
// do: not while a prepared key is already waiting.
func (m *manager) prepareJWTKeyNowLocked() bool {
	for _, k := range m.jwtKeys {
		if k.State == castate.StatePrepared {
			m.cfg.Logger.Info("JWT key rotation requested but a prepared key is already waiting", logattr.KeyID, k.KID)
			return false
		}
	}
	return true
}

// rotateJWTKeyPlugin is rotateJWTKey in plug-in mode: the prepared key is
// committed with the plug-in journal by a sync, which this runs.
func (m *manager) rotateJWTKeyPlugin() error {
	return m.syncPluginWith(true)
}

// jwtStepsLocked runs the JWT key steps due now and, when force (plug-in
// mode), a rotation rotateJWTKey asked for.
func (m *manager) jwtStepsLocked(force bool) (bool, error) {
	changed, err := m.reconcileJWTLocked()
	if err != nil || !force || !m.prepareJWTKeyNowLocked() {
		return changed, err
	}
	if err := m.newJWTKeyLocked(m.cfg.Clock.Now(), castate.StatePrepared, "forced"); err != nil {
		return changed, err
	}
	return true, nil
}

// noJWTKeyLocked says why there is no active JWT key, and when there
// will be.
func (m *manager) noJWTKeyLocked() error {
	for _, k := range m.jwtKeys {
		if k.State != castate.StatePrepared {
			continue
		}
		if at := m.jwtTimelineLocked().activateAt(jwtKeyTimes(k)); !at.IsZero() {
			return fmt.Errorf("ca: %w: JWT key %s is published ahead of use so that peers hold it first; it signs from %s",
				ErrInvalidSigningMaterial, k.KID, at.UTC().Format(time.RFC3339))
		}
		return fmt.Errorf("ca: %w: JWT key %s signs %s after a server first publishes it",
			ErrInvalidSigningMaterial, k.KID, PublishLead*m.cfg.RefreshHint)
	}
	return fmt.Errorf("ca: %w: no active JWT key (an earlier trustbridge wrote %s; the leader creates one at its next check)", ErrInvalidSigningMaterial, m.backend.Describe())
}

func (m *manager) activeJWTKeyLocked() *castate.JWTKey {
	for _, k := range m.jwtKeys {
		if k.State == castate.StateActive {
			return k
		}
	}
	return nil
}

// jwtKeyInfos is Authority.JWTKeys.
func (m *manager) jwtKeyInfos() []JWTKeyInfo {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]JWTKeyInfo, 0, len(m.jwtKeys))
	for _, k := range m.jwtKeys {
		out = append(out, JWTKeyInfo{JWTKeyRecord: k.JWTKeyRecord, Public: k.Key.Public()})
	}
	for _, rev := range m.journal.Revoked {
		if rev.JWTKey == nil {
			continue
		}
		pub, err := x509.ParsePKIXPublicKey(rev.PublicKey) // checked by DecodeJournal
		if err != nil {
			continue
		}
		out = append(out, JWTKeyInfo{JWTKeyRecord: *rev.JWTKey, Public: pub, RevokedAt: rev.RevokedAt})
	}
	return out
}
