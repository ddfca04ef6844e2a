package server

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/datadir"
	"github.com/trustbridge/trustbridge/internal/fileutil"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// initFlag lets a server create a new CA where there is none.
const initFlag = "init"

// serverLockCommand is what the data directory's lock record names.
const serverLockCommand = "trustbridge server"

// prepareDataDir checks --data-dir before anything is written to it. With
// file storage a directory without CA state means a new root CA, which a
// mistyped path must not make: a missing directory is created (0700) only
// with --init, and one that holds other files is used only with --init.
// With --storage kube the directory holds no CA and is created as needed.
func prepareDataDir(o Config) error {
	_, err := os.Stat(o.DataDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if !o.Init && fileStorage(o) {
			return fmt.Errorf("--data-dir %s does not exist, and starting there would %s; "+
				"if the path is wrong, fix it; if this is the first start of this trust domain, pass --%s (or create the directory empty: mkdir -m 700 %s)",
				o.DataDir, startsOver(o), initFlag, o.DataDir)
		}
	case err != nil:
		return fmt.Errorf("--data-dir: %w", err)
	}
	// Whoever else can write to the data dir could plant a root key, a
	// journal or an audit log this server would trust or extend.
	if err := fileutil.EnsureDir(o.DataDir); err != nil {
		return fmt.Errorf("--data-dir: %w", err)
	}
	if !fileStorage(o) || o.Init {
		return nil
	}
	store := ca.NewStore(o.DataDir)
	if has, err := store.HasState(); err != nil || has {
		return err
	}
	others, err := otherEntries(o.DataDir, store)
	if err != nil {
		return fmt.Errorf("--data-dir: %w", err)
	}
	if len(others) > 0 {
		// A server that holds the directory and is creating its first CA
		// right now: say that, not that the directory looks foreign.
		if h, held, _ := datadir.Probe(o.DataDir); held {
			return fmt.Errorf("--data-dir: %w", &datadir.HeldError{Dir: o.DataDir, Holder: h})
		}
		return fmt.Errorf("--data-dir %s holds %s but no CA state (%s), and starting would %s; "+
			"if the path is wrong, fix it; if the CA state was lost, restore it from a backup; to start new CA state in this directory anyway, pass --%s",
			o.DataDir, strings.Join(others, ", "), filepath.Join(store.Dir(), castate.JournalKey), startsOver(o), initFlag)
	}
	return nil
}

// otherTrustDomain says which flag to fix when the CA state found is of
// another trust domain than --trust-domain: the state is sound, the flag
// or the place is wrong. Other errors are returned as they are.
func (k *kubeSetup) otherTrustDomain(err error, dataDir string, td spiffeid.TrustDomain) error {
	var other *castate.TrustDomainError
	if !errors.As(err, &other) {
		return err
	}
	where, instead := "data dir "+dataDir, "another --data-dir"
	if k != nil {
		where = fmt.Sprintf("Secret %s/%s (--ca-secret in --namespace)", k.namespace, k.o.CASecret)
		instead = "another --ca-secret or --namespace"
	}
	return fmt.Errorf("%s holds the CA of trust domain %s; this server was started with --trust-domain %s: use --trust-domain %s, or %s",
		where, other.Holds, td.Name(), other.Holds, instead)
}

// startsOver says what a server without CA state would start anew.
func startsOver(o Config) string {
	if o.CADir != "" {
		return "start the published roots' history and the bundle sequence over (roots --ca-dir had before would leave the bundle at once)"
	}
	return "create a new root CA that every workload and federated peer must learn anew"
}

func fileStorage(o Config) bool {
	return o.Kube.Storage == "" || o.Kube.Storage == StorageFile
}

// otherEntries lists what dir holds besides the lock file, a file
// system's lost+found and a CA state directory with nothing in it yet (a
// first start cut short), at most 5 names.
func otherEntries(dir string, store *ca.Store) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if slices.Contains([]string{datadir.LockName, "lost+found"}, e.Name()) {
			continue
		}
		if e.Name() == filepath.Base(store.Dir()) {
			blank, err := store.Blank()
			if err != nil {
				return nil, err
			}
			if blank {
				continue
			}
		}
		names = append(names, e.Name())
	}
	if len(names) > 5 {
		names = append(names[:5], fmt.Sprintf("%d more", len(names)-5))
	}
	return names, nil
}

// lockDataDir makes this server the data directory's one writer. It runs
// before anything there is read or written (the CA state, the audit log,
// the last-known-good bundles, the ACME cache), and says when this start
// creates a new CA.
func lockDataDir(o Config, logger *slog.Logger) (*datadir.Lock, error) {
	lock, err := datadir.Acquire(o.DataDir, datadir.Self(serverLockCommand))
	if err != nil {
		return nil, fmt.Errorf("--data-dir: %w", err)
	}
	if !datadir.Supported {
		logger.Warn("no data directory lock on this platform: make sure no other server uses this --data-dir", logattr.DataDir, o.DataDir)
	}
	if fileStorage(o) {
		has, err := ca.NewStore(o.DataDir).HasState()
		if err != nil {
			_ = lock.Release()
			return nil, err
		}
		switch {
		case !has && o.Init:
			logger.Info("first start (--init): no CA state in the data directory; creating it", logattr.DataDir, o.DataDir)
		case !has:
			logger.Info("first start (empty data directory): no CA state; creating it", logattr.DataDir, o.DataDir)
		case o.Init:
			logger.Info("--init: the data directory already holds CA state; using it", logattr.DataDir, o.DataDir)
		}
	}
	return lock, nil
}
