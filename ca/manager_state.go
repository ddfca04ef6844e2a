package ca

import (
	"errors"
	"fmt"
	"time"

	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// conflictAttempts bounds how often one change is decided again after
// another writer got in first.
const conflictAttempts = 2

// withStateLocked runs f holding the state's exclusive lock and m.mu,
// after picking up changes other processes made to it. When another writer
// committed between the load and f's commit (ErrConflict), f's version is
// dropped, never published, and f decides again on the reloaded state.
func (m *manager) withStateLocked(f func() error) error {
	unlock, err := m.lockState()
	if err != nil {
		return err
	}
	defer unlock()
	for attempt := 0; ; attempt++ {
		if err := m.reloadStateLocked(attempt > 0); err != nil {
			return err
		}
		err := m.decideLocked(f)
		if err == nil {
			return nil
		}
		if !errors.Is(err, castate.ErrConflict) {
			return err
		}
		m.cfg.Logger.Warn("CA state changed by another writer; reloading it and deciding again", logattr.Error, err)
		if attempt+1 == conflictAttempts {
			// Serve what the other writer committed, not this version.
			if rerr := m.reloadStateLocked(true); rerr != nil {
				return errors.Join(err, rerr)
			}
			return err
		}
	}
}

// decideLocked runs f as one change (lockChange). f changes state in
// place before saving it; if the save fails, what is in memory goes back
// to what is stored and published, or the CA would sign with a root nobody
// has seen.
func (m *manager) decideLocked(f func() error) error {
	m.lockChange()
	defer m.unlockChange()
	journal, roots, jwtKeys := m.journal.Clone(), cloneRoots(m.roots), cloneJWTKeys(m.jwtKeys)
	err := f()
	if err != nil {
		m.journal, m.roots, m.jwtKeys = journal, roots, jwtKeys
	}
	return err
}

// reloadStateLocked reads the state (the caller holds lockState, not mu)
// and publishes it as one change (lockChange).
func (m *manager) reloadStateLocked(force bool) error {
	st, err := m.readState(force)
	if err != nil || st == nil {
		return err
	}
	m.lockChange()
	defer m.unlockChange()
	return m.applyStateLocked(st)
}

// reload is Authority.Reload.
func (m *manager) reload() error {
	if m.cfg.Plugin != nil {
		return nil
	}
	unlock, err := m.lockState()
	if err != nil {
		return err
	}
	defer unlock()
	return m.reloadStateLocked(false)
}

// leading reports whether this Authority may change the state.
func (m *manager) leading() bool {
	return m.cfg.Leader == nil || m.cfg.Leader.IsLeader()
}

// lockState takes stateMu, then the state's exclusive lock; the returned
// func releases both. Callers take m.mu only around changes readers see.
func (m *manager) lockState() (func(), error) {
	m.stateMu.Lock()
	unlock, err := m.backend.Lock(true)
	if err != nil {
		m.stateMu.Unlock()
		return nil, err
	}
	return func() {
		unlock()
		m.stateMu.Unlock()
	}, nil
}

func cloneRoots(roots []*castate.Root) []*castate.Root {
	out := make([]*castate.Root, len(roots))
	for i, r := range roots {
		c := *r
		out[i] = &c
	}
	return out
}

func (m *manager) settings() castate.JournalSettings {
	return castate.JournalSettings{
		KeyType:                   string(m.cfg.KeyType),
		RootTTLSeconds:            int64(m.cfg.RootTTL / time.Second),
		RefreshHintSeconds:        int64(m.cfg.RefreshHint / time.Second),
		CurrentMaxWorkloadSeconds: int64(m.cfg.MaxWorkloadTTL / time.Second),
		JWTKeyType:                string(m.cfg.JWTKeyType),
		JWTKeyTTLSeconds:          int64(m.cfg.JWTKeyTTL / time.Second),
		CurrentMaxJWTSVIDSeconds:  int64(m.cfg.MaxJWTSVIDTTL / time.Second),
		SignsIntermediates:        m.cfg.SignsIntermediates,
	}
}

// loadedState is the state as read from the backend.
type loadedState struct {
	journal *castate.Journal
	roots   []*castate.Root
	jwtKeys []*castate.JWTKey
	version string
}

// readState loads the state if its version changed since it was last read
// or written (always, with force); nil means unchanged. The caller holds
// lockState but not mu: the backend may be an API server that does not
// answer, and m.version only changes under lockState.
func (m *manager) readState(force bool) (*loadedState, error) {
	if !force && m.version != "" {
		if v, err := m.backend.Version(); err == nil && v == m.version {
			return nil, nil
		}
	}
	j, roots, jwtKeys, version, err := m.backend.Load(m.cfg.TrustDomain.Name())
	if err != nil {
		return nil, err
	}
	if err := m.resolveKeys(roots, jwtKeys); err != nil {
		return nil, err
	}
	return &loadedState{journal: j, roots: roots, jwtKeys: jwtKeys, version: version}, nil
}

// applyStateLocked checks state read by readState against what is
// published and publishes it; nil st (unchanged) does nothing.
func (m *manager) applyStateLocked(st *loadedState) error {
	if st == nil {
		return nil
	}
	j, roots, version := st.journal, st.roots, st.version
	if m.journal.Sequence > 0 {
		// Once running, state never starts over: a vanished journal or a
		// sequence going back means someone removed or replaced the
		// state under us, and a new root would drop the ones peers use.
		if j == nil {
			return fmt.Errorf("ca: %s disappeared while the server was running; refusing to start a new CA over it (restore it, or restart on purpose)", m.backend.Describe())
		}
		if j.Sequence < m.journal.Sequence {
			return fmt.Errorf("ca: %s went back from sequence %d to %d; refusing to publish an older state", m.backend.Describe(), m.journal.Sequence, j.Sequence)
		}
	}
	if err := m.checkMode(roots); err != nil {
		return err
	}
	if j == nil {
		j = &castate.Journal{TrustDomain: m.cfg.TrustDomain.Name()}
	} else if len(j.PluginRoots) > 0 {
		return fmt.Errorf("ca: %s was used with a plug-in CA (--ca-dir); starting a self-signed CA on it would drop those roots from the bundle at once; keep --ca-dir or use a fresh --data-dir", m.backend.Describe())
	} else if m.version != "" && version != m.version {
		m.cfg.Logger.Info("CA state changed in "+m.backend.Describe()+"; reloaded", logattr.Sequence, j.Sequence)
	}
	m.journal, m.roots, m.jwtKeys, m.version = j, roots, st.jwtKeys, version
	m.publishLocked()
	return nil
}

// commitLocked persists the journal and the roots' material, and
// publishes the new bundle. Only the leader writes: a replica that lost
// leadership since it decided writes nothing (and the backend checks
// again).
func (m *manager) commitLocked() error {
	if !m.leading() {
		return fmt.Errorf("ca: %w: not writing CA state to %s", castate.ErrNotLeader, m.backend.Describe())
	}
	m.journal.Roots = m.journal.Roots[:0]
	for _, r := range m.roots {
		m.journal.Roots = append(m.journal.Roots, r.RootRecord)
	}
	m.recordJWTKeysLocked()
	m.journal.Updated = m.cfg.Clock.Now()
	if s := int64(m.cfg.MaxWorkloadTTL / time.Second); s > m.journal.MaxWorkloadTTLSeconds {
		m.journal.MaxWorkloadTTLSeconds = s
	}
	st := m.settings()
	m.journal.Settings = &st
	version, err := m.backend.Commit(m.version, m.journal, m.roots, m.jwtKeys)
	if err != nil {
		return err
	}
	m.version = version
	for _, r := range m.roots {
		// Roots this commit publishes were published when decided, in this
		// critical section.
		if _, ok := m.served[r.ID]; !ok && !r.PublishedAt.IsZero() {
			m.served[r.ID] = r.PublishedAt
		}
	}
	m.markJWTServedLocked()
	m.publishLocked()
	m.destroyDroppedKeysLocked()
	return nil
}
