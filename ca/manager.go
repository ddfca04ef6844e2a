package ca

import (
	"errors"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

	"github.com/trustbridge/trustbridge/ca/castate"
)

// manager is the state half of the CA, SPIRE's ca/manager: it owns the
// journal, the roots (or upstream intermediates, or plug-in roots) and the
// JWT keys, reads and writes them through the backend, steps them along
// the rotation timeline, and publishes the result: the bundle, and what
// signing uses.
type manager struct {
	cfg     *Config
	store   *Store // the file store, when Config.Backend is nil
	backend castate.Backend
	metrics *metrics

	// stateMu serializes everything that reads or changes the shared
	// state (reloads, rotation checks, plug-in syncs); it is taken before
	// the backend's lock and before mu. Backend reads happen under stateMu
	// alone, so a slow or unreachable API server never stalls signing and
	// Bundle, which read the board; every writer of journal, roots and
	// version holds both, through lockChange, which also holds off
	// signers that read their time while the change runs (see board).
	// mu alone guards what only the manager reads (subs, lastErr, up).
	stateMu sync.Mutex
	mu      sync.RWMutex
	journal *castate.Journal
	roots   []*castate.Root   // in journal order
	jwtKeys []*castate.JWTKey // in journal order
	version string            // of the state as last written or read
	bundle  *spiffebundle.Bundle

	subs []chan struct{} // Subscribe
	// published is the root states last published (id=state,...), so
	// subscribers hear of a state change that leaves the bundle alone.
	published string
	kick      chan struct{} // Recheck

	// served is when this process first published each root. The
	// publication lead of a prepared root counts from when peers could
	// fetch it; PublishedAt in the journal says when a trustbridge first
	// served it, and served says whether this process can vouch that it
	// has been served since.
	//
	// One process (file store): it served nothing while it was down, so
	// after a restart a waiting root's lead starts again at the restart;
	// served, set when the state is first loaded, is that instant, and
	// the leader moves PublishedAt up to it.
	//
	// Several replicas behind one Service (Config.Leader): a peer's poll
	// reaches any replica, and every replica serves the bundle of the
	// shared state, reloaded through a watch moments after the leader
	// writes. When leadership moves, the new leader moves PublishedAt up
	// to when it itself began serving the root: for a replica that was
	// following when the root was prepared that is the old PublishedAt
	// plus the watch delay (the lead is kept); for one that started later,
	// say after every replica was down, it is its own start, which covers
	// any gap when nobody served the root. The lead is never shortened,
	// at worst restarted.
	served map[string]time.Time
	// floored is set once this process wrote the state for the first
	// time, with a new sequence (sequence.go, rule 2).
	floored bool
	// lastErr is the error of the last scheduled rotation check, for Ready.
	lastErr error
	// plugin is the plug-in material as last published, so signing never
	// runs ahead of the bundle peers have seen.
	plugin *PluginMaterial
	// pluginSigners are earlier plug-in CA certificates, for IssuedHere.
	pluginSigners []pluginSigner
	// up is the upstream's health, in upstream mode (under mu).
	up upstreamStatus

	keyRefs keyRefCache // keys of Config.Keys, by KeyRef
	// destroyed are the KeyRefs this process destroyed, so that those of
	// revoked authorities are not destroyed again at every commit.
	destroyed map[string]bool

	// board is where each change's result is published for signing:
	// every change to what signing reads runs between lockChange and
	// unlockChange.
	board *board
}

func newManager(cfg *Config, mets *metrics) *manager {
	m := &manager{
		cfg:     cfg,
		backend: cfg.Backend,
		metrics: mets,
		kick:    make(chan struct{}, 1),
		served:  map[string]time.Time{},
		// Until state is loaded (a follower before the leader created
		// it) the bundle has no authorities: served by nobody, trusted
		// by nobody.
		bundle:  spiffebundle.New(cfg.TrustDomain),
		journal: &castate.Journal{TrustDomain: cfg.TrustDomain.Name()},

		destroyed: map[string]bool{},
	}
	if m.backend == nil {
		m.store = NewStore(cfg.DataDir)
		m.backend = fileBackend{m.store}
	}
	m.board = newBoard(m.snapshotLocked())
	return m
}

// start publishes the first state: the plug-in directory's, or the
// backend's after a first reconcile.
func (m *manager) start() error {
	if m.cfg.Plugin != nil {
		if err := m.cfg.Plugin.load(); err != nil {
			return err
		}
		// syncPlugin publishes what Load loaded; the change Load
		// signalled, left pending, would have Run publish it again at
		// its first turn, after whatever happened meanwhile. A change
		// signalled from now on is a real one.
		select {
		case <-m.cfg.Plugin.changes():
		default:
		}
		return m.syncPlugin()
	}
	if err := m.reconcile(); err != nil {
		if !errors.Is(err, errNoIntermediate) {
			return err
		}
		// An unreachable upstream at the first start: serve, not ready,
		// and let Run retry.
		m.recordCheck(err, "no intermediate from the upstream authority yet; the CA cannot sign until it answers")
	}
	return nil
}
