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

// withStateLocked runs f holding the state's exclusive lock and a.mu,
// after picking up changes other processes made to it. When another writer
// committed between the load and f's commit (ErrConflict), f's version is
// dropped, never published, and f decides again on the reloaded state.
func (a *Authority) withStateLocked(f func() error) error {
	unlock, err := a.lockState()
	if err != nil {
		return err
	}
	defer unlock()
	for attempt := 0; ; attempt++ {
		if err := a.reloadStateLocked(attempt > 0); err != nil {
			return err
		}
		err := a.decideLocked(f)
		if err == nil {
			return nil
		}
		if !errors.Is(err, castate.ErrConflict) {
			return err
		}
		a.cfg.Logger.Warn("CA state changed by another writer; reloading it and deciding again", logattr.Error, err)
		if attempt+1 == conflictAttempts {
			// Serve what the other writer committed, not this version.
			if rerr := a.reloadStateLocked(true); rerr != nil {
				return errors.Join(err, rerr)
			}
			return err
		}
	}
}

// decideLocked runs f under mu. f changes state in place before saving
// it; if the save fails, what is in memory goes back to what is stored and
// published, or the CA would sign with a root nobody has seen.
func (a *Authority) decideLocked(f func() error) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	journal, roots, jwtKeys := a.journal.Clone(), cloneRoots(a.roots), cloneJWTKeys(a.jwtKeys)
	err := f()
	if err != nil {
		a.journal, a.roots, a.jwtKeys = journal, roots, jwtKeys
	}
	return err
}

// reloadStateLocked reads the state (the caller holds lockState, not mu)
// and, under mu, publishes it.
func (a *Authority) reloadStateLocked(force bool) error {
	st, err := a.readState(force)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.applyStateLocked(st)
}

// Reload picks up state another replica or process wrote and publishes
// it, without changing anything. A watch on the shared state calls it (or
// Recheck) as soon as the leader writes.
func (a *Authority) Reload() error {
	if a.cfg.Plugin != nil {
		return nil
	}
	unlock, err := a.lockState()
	if err != nil {
		return err
	}
	defer unlock()
	return a.reloadStateLocked(false)
}

// leading reports whether this Authority may change the state.
func (a *Authority) leading() bool {
	return a.cfg.Leader == nil || a.cfg.Leader.IsLeader()
}

// lockState takes stateMu, then the state's exclusive lock; the returned
// func releases both. Callers take a.mu only around changes readers see.
func (a *Authority) lockState() (func(), error) {
	a.stateMu.Lock()
	unlock, err := a.backend.Lock(true)
	if err != nil {
		a.stateMu.Unlock()
		return nil, err
	}
	return func() {
		unlock()
		a.stateMu.Unlock()
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

func (a *Authority) settings() castate.JournalSettings {
	return castate.JournalSettings{
		KeyType:                   string(a.cfg.KeyType),
		RootTTLSeconds:            int64(a.cfg.RootTTL / time.Second),
		RefreshHintSeconds:        int64(a.cfg.RefreshHint / time.Second),
		CurrentMaxWorkloadSeconds: int64(a.cfg.MaxWorkloadTTL / time.Second),
		JWTKeyType:                string(a.cfg.JWTKeyType),
		JWTKeyTTLSeconds:          int64(a.cfg.JWTKeyTTL / time.Second),
		CurrentMaxJWTSVIDSeconds:  int64(a.cfg.MaxJWTSVIDTTL / time.Second),
		SignsIntermediates:        a.cfg.SignsIntermediates,
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
// answer, and a.version only changes under lockState.
func (a *Authority) readState(force bool) (*loadedState, error) {
	if !force && a.version != "" {
		if v, err := a.backend.Version(); err == nil && v == a.version {
			return nil, nil
		}
	}
	j, roots, jwtKeys, version, err := a.backend.Load(a.cfg.TrustDomain.Name())
	if err != nil {
		return nil, err
	}
	if err := a.resolveKeys(roots, jwtKeys); err != nil {
		return nil, err
	}
	return &loadedState{journal: j, roots: roots, jwtKeys: jwtKeys, version: version}, nil
}

// applyStateLocked checks state read by readState against what is
// published and publishes it; nil st (unchanged) does nothing.
func (a *Authority) applyStateLocked(st *loadedState) error {
	if st == nil {
		return nil
	}
	j, roots, version := st.journal, st.roots, st.version
	if a.journal.Sequence > 0 {
		// Once running, state never starts over: a vanished journal or a
		// sequence going back means someone removed or replaced the
		// state under us, and a new root would drop the ones peers use.
		if j == nil {
			return fmt.Errorf("ca: %s disappeared while the server was running; refusing to start a new CA over it (restore it, or restart on purpose)", a.backend.Describe())
		}
		if j.Sequence < a.journal.Sequence {
			return fmt.Errorf("ca: %s went back from sequence %d to %d; refusing to publish an older state", a.backend.Describe(), a.journal.Sequence, j.Sequence)
		}
	}
	if err := a.checkMode(roots); err != nil {
		return err
	}
	if j == nil {
		j = &castate.Journal{TrustDomain: a.cfg.TrustDomain.Name()}
	} else if len(j.PluginRoots) > 0 {
		return fmt.Errorf("ca: %s was used with a plug-in CA (--ca-dir); starting a self-signed CA on it would drop those roots from the bundle at once; keep --ca-dir or use a fresh --data-dir", a.backend.Describe())
	} else if a.version != "" && version != a.version {
		a.cfg.Logger.Info("CA state changed in "+a.backend.Describe()+"; reloaded", logattr.Sequence, j.Sequence)
	}
	a.journal, a.roots, a.jwtKeys, a.version = j, roots, st.jwtKeys, version
	a.publishLocked()
	return nil
}

// commitLocked persists the journal and the roots' material, and
// publishes the new bundle. Only the leader writes: a replica that lost
// leadership since it decided writes nothing (and the backend checks
// again).
func (a *Authority) commitLocked() error {
	if !a.leading() {
		return fmt.Errorf("ca: %w: not writing CA state to %s", castate.ErrNotLeader, a.backend.Describe())
	}
	a.journal.Roots = a.journal.Roots[:0]
	for _, r := range a.roots {
		a.journal.Roots = append(a.journal.Roots, r.RootRecord)
	}
	a.recordJWTKeysLocked()
	a.journal.Updated = a.cfg.Clock.Now()
	if s := int64(a.cfg.MaxWorkloadTTL / time.Second); s > a.journal.MaxWorkloadTTLSeconds {
		a.journal.MaxWorkloadTTLSeconds = s
	}
	st := a.settings()
	a.journal.Settings = &st
	version, err := a.backend.Commit(a.version, a.journal, a.roots, a.jwtKeys)
	if err != nil {
		return err
	}
	a.version = version
	for _, r := range a.roots {
		// Roots this commit publishes were published when decided, in this
		// critical section.
		if _, ok := a.served[r.ID]; !ok && !r.PublishedAt.IsZero() {
			a.served[r.ID] = r.PublishedAt
		}
	}
	a.markJWTServedLocked()
	a.publishLocked()
	a.destroyDroppedKeysLocked()
	return nil
}
