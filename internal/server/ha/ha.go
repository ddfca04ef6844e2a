// Package ha runs one replica of a highly available trustbridge: the CA
// and a watch on the CA state the replicas share run on every replica, and
// an election picks the one that also rotates roots and runs the leader's
// duties (federation polling, root distribution). Followers take what the
// leader saves through their watches.
//
// The order matters and is this package's to keep: a replica can serve
// only once its CA can sign (Start waits for that, whoever leads), and a
// new leader runs its duties only once the server has handed them over
// (Lead), however early it was elected.
package ha

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/loop"
)

// CA is what a replica needs of the certificate authority.
type CA interface {
	// Run reloads the shared state when asked to recheck, and rotates
	// roots when this replica leads.
	Run(ctx context.Context) error
	// Recheck asks Run to look at the shared state now, and wakes the
	// subscribers.
	Recheck()
	// Ready is nil once the CA can sign.
	Ready() error
	// Subscribe signals each change of the CA's state.
	Subscribe() <-chan struct{}
}

// Elector elects one leader among the replicas.
type Elector interface {
	// Run campaigns until ctx is done, running lead while leading.
	Run(ctx context.Context, lead func(ctx context.Context) error) error
}

// Config is what a replica runs.
type Config struct {
	CA CA
	// WatchCA watches the shared CA state until ctx is done, calling
	// onChange on each change.
	WatchCA func(ctx context.Context, onChange func()) error
	Elector Elector
	// State names the shared CA state in the log while a replica waits for
	// it ("secret ns/name").
	State  string
	Logger *slog.Logger
	// Clock paces the wait's log lines; nil means the real clock.
	Clock clock.WithTicker
}

// waitLogEvery is how often Start says what it waits for.
const waitLogEvery = 10 * time.Second

// Replica is a running replica.
type Replica struct {
	cfg Config
	// handed is closed by Lead once duties are set; every term runs them.
	handed chan struct{}
	duties []func(context.Context) error
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// Start starts the CA, its watch and the election in the background and
// returns once the CA can sign. It returns (nil, error) if they end before
// that, and (nil, nil) when ctx ends first: a stop while waiting for a
// first leader is as clean as a stop while serving.
func Start(ctx context.Context, cfg Config) (*Replica, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	r := &Replica{cfg: cfg, handed: make(chan struct{}), done: make(chan struct{})}
	changes := cfg.CA.Subscribe()
	ctx, r.cancel = context.WithCancel(ctx)
	go func() {
		defer close(r.done)
		r.err = loop.RunAll(ctx,
			cfg.CA.Run,
			func(ctx context.Context) error { return cfg.WatchCA(ctx, cfg.CA.Recheck) },
			func(ctx context.Context) error { return cfg.Elector.Run(ctx, r.lead) },
		)
	}()
	if err := r.waitReady(ctx, changes); err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, r.Stop()
	}
	return r, nil
}

// waitReady waits until the CA can sign, saying every waitLogEvery what it
// waits for.
func (r *Replica) waitReady(ctx context.Context, changes <-chan struct{}) error {
	tick := r.cfg.Clock.NewTicker(time.Second)
	defer tick.Stop()
	waiting := r.cfg.Clock.Now()
	for r.cfg.CA.Ready() != nil {
		select {
		case <-ctx.Done():
			return nil
		case <-r.done:
			if ctx.Err() != nil {
				return nil // stopped: the background ended because ctx did
			}
			if err := r.Stop(); err != nil {
				return fmt.Errorf("kubernetes: %w", err)
			}
			return errors.New("kubernetes: the CA, its watch and the leader election ended before the CA could sign")
		case <-changes:
		case <-tick.C():
			if r.cfg.Clock.Since(waiting) >= waitLogEvery {
				waiting = r.cfg.Clock.Now()
				r.cfg.Logger.Info("waiting for CA state: a leader must be elected and bootstrap it, or the Secret must be readable",
					"secret", r.cfg.State, logattr.Error, r.cfg.CA.Ready())
			}
		}
	}
	return nil
}

// Lead hands over the leader's duties, which a leader runs from then on
// (this replica now if it leads, or when it is elected). Until then a
// leader only runs the CA's rotation. Call it once.
func (r *Replica) Lead(duties ...func(context.Context) error) {
	r.duties = duties
	close(r.handed)
}

// lead is what the elector runs while this replica leads.
func (r *Replica) lead(ctx context.Context) error {
	log := r.cfg.Logger.With(logattr.Component, "leader")
	log.Info("leading: rotating roots, polling federation, distributing roots")
	// A new leader decides at once on what the old one left.
	r.cfg.CA.Recheck()
	select {
	case <-r.handed:
	case <-ctx.Done():
		return nil
	}
	parts := append([]func(context.Context) error{func(ctx context.Context) error { <-ctx.Done(); return nil }}, r.duties...)
	err := loop.RunAll(ctx, parts...)
	log.Info("no longer leading")
	return err
}

// Stop ends the replica's background parts and returns their error.
func (r *Replica) Stop() error {
	r.cancel()
	<-r.done
	return r.err
}

// Run joins the replica to the server's run: it stops with the server, and
// its ending (the election or the watch stopped) stops the server.
func (r *Replica) Run(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return r.Stop()
	case <-r.done:
		if r.err == nil {
			return errors.New("kubernetes: leader election or CA watch stopped")
		}
		return r.err
	}
}
