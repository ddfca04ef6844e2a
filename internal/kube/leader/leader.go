package leader

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"
)

// Defaults for Config, those of Kubernetes' own controllers.
const (
	DefaultName          = "trustbridge-leader"
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// Config configures an Elector. Zero fields take defaults.
type Config struct {
	Client    kubernetes.Interface
	Namespace string
	// Name of the Lease.
	Name string
	// Identity of this replica in the Lease; default hostname plus a
	// random suffix, so a restarted pod never inherits its old lease.
	Identity      string
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	// Clock measures how long ago the lease was last renewed.
	Clock      clock.Clock
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Elector campaigns for the Lease and runs a function while it leads.
type Elector struct {
	cfg   Config
	gauge prometheus.Gauge

	mu      sync.Mutex
	leading bool      // between OnStartedLeading and the end of lead
	renewed time.Time // start of the last successful acquire or renew
	// renewedCh is signalled (coalesced) after every successful renewal,
	// so the watchdog re-arms.
	renewedCh chan struct{}
}

// New checks cfg; it starts nothing.
func New(cfg Config) (*Elector, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	e := &Elector{cfg: cfg, renewedCh: make(chan struct{}, 1)}
	e.gauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "trustbridge_leader",
		Help:        "1 while this replica holds the leader Lease, else 0.",
		ConstLabels: prometheus.Labels{"identity": cfg.Identity},
	})
	if err := cfg.Registerer.Register(e.gauge); err != nil {
		return nil, fmt.Errorf("leader: %w", err)
	}
	return e, nil
}

// setDefaults refuses a config without a client or namespace, fills in the
// fields left zero, and checks the timings against the elector's rules.
func (c *Config) setDefaults() error {
	if c.Client == nil {
		return errors.New("leader: a Kubernetes client is required")
	}
	if c.Namespace == "" {
		return errors.New("leader: a namespace is required")
	}
	c.Name = cmp.Or(c.Name, DefaultName)
	if c.Identity == "" {
		id, err := newIdentity()
		if err != nil {
			return err
		}
		c.Identity = id
	}
	c.LeaseDuration = cmp.Or(c.LeaseDuration, DefaultLeaseDuration)
	c.RenewDeadline = cmp.Or(c.RenewDeadline, DefaultRenewDeadline)
	c.RetryPeriod = cmp.Or(c.RetryPeriod, DefaultRetryPeriod)
	if err := c.checkTimings(); err != nil {
		return err
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	return nil
}

// newIdentity is the default Identity: the hostname plus a random suffix,
// so a restarted pod never inherits its old lease.
func newIdentity() (string, error) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "trustbridge"
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("leader: identity: %w", err)
	}
	return host + "_" + hex.EncodeToString(b[:]), nil
}

// checkTimings applies the elector's own rules to the lease duration,
// renew deadline and retry period, so a bad flag fails at start.
func (c *Config) checkTimings() error {
	switch {
	case c.LeaseDuration < time.Second || c.LeaseDuration%time.Second != 0:
		// The Lease records whole seconds and other replicas count from
		// that; a truncated duration could end before our renew deadline.
		return fmt.Errorf("leader: lease duration %s must be a whole number of seconds: the Lease records seconds", c.LeaseDuration)
	case c.LeaseDuration <= c.RenewDeadline:
		return fmt.Errorf("leader: lease duration %s must be longer than the renew deadline %s", c.LeaseDuration, c.RenewDeadline)
	case c.RenewDeadline <= time.Duration(leaderelection.JitterFactor*float64(c.RetryPeriod)):
		return fmt.Errorf("leader: renew deadline %s must be longer than %.1f retry periods (%s)", c.RenewDeadline, leaderelection.JitterFactor, c.RetryPeriod)
	case c.RetryPeriod <= 0:
		return errors.New("leader: retry period must be positive")
	}
	return nil
}

// Identity is this replica's name in the Lease.
func (e *Elector) Identity() string { return e.cfg.Identity }

// IsLeader reports whether this replica leads now: it has started leading,
// and its last renewal began less than RenewDeadline ago. Past that, the
// elector is about to give up and, LeaseDuration after the last renewal,
// another replica may take over; a write must not race that.
func (e *Elector) IsLeader() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.isLeaderLocked()
}

// LeadingUntil is when IsLeader turns false unless the lease is renewed
// first, or zero while this replica does not lead. Writers bound their
// requests by it (fence.Writer, under ca/kubestore and federation/kubelkg),
// so a write cannot land long after another replica may have taken over.
func (e *Elector) LeadingUntil() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.isLeaderLocked() {
		return time.Time{}
	}
	// Measured on cfg.Clock; as a wall-clock instant for deadlines.
	return time.Now().Add(e.cfg.RenewDeadline - e.cfg.Clock.Since(e.renewed))
}

func (e *Elector) isLeaderLocked() bool {
	return e.leading && e.cfg.Clock.Since(e.renewed) < e.cfg.RenewDeadline
}

// Run campaigns until ctx is done. While this replica leads, lead runs
// with a context that is cancelled the moment leadership may be lost (or
// ctx is done); Run waits for lead to return, then campaigns again. An
// error from lead is logged and gives up leadership. When ctx is done the
// Lease is released, after lead has returned, so the next leader need not
// wait for it to expire.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context) error) error {
	lock := &observedLock{
		Interface: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: e.cfg.Namespace, Name: e.cfg.Name},
			Client:     e.cfg.Client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: e.cfg.Identity},
		},
		e: e,
	}
	log := e.cfg.Logger.With("lease", e.cfg.Namespace+"/"+e.cfg.Name, "identity", e.cfg.Identity)
	for ctx.Err() == nil {
		if err := e.round(ctx, lock, lead, log); err != nil {
			return err
		}
		// A round ends after leading: lead failed or returned, or the
		// lease was lost. Campaign again a retry period later, so lead
		// work that fails at once does not spin acquiring and releasing
		// the Lease, and other replicas get their chance.
		t := e.cfg.Clock.NewTimer(e.cfg.RetryPeriod)
		select {
		case <-ctx.Done():
		case <-t.C():
		}
		t.Stop()
	}
	return nil
}

// round campaigns once: until this replica led and lost, or ctx is done.
func (e *Elector) round(ctx context.Context, lock resourcelock.Interface, lead func(context.Context) error, log *slog.Logger) error {
	// The elector's context ends only once lead has returned: with
	// ReleaseOnCancel, releasing earlier would let another replica lead
	// while lead still writes.
	elCtx, elCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer elCancel()
	var gate roundGate
	stop := context.AfterFunc(ctx, func() {
		gate.end()
		elCancel()
	})
	defer stop()
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   e.cfg.LeaseDuration,
		RenewDeadline:   e.cfg.RenewDeadline,
		RetryPeriod:     e.cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            e.cfg.Name,
		Callbacks:       e.callbacks(ctx, &gate, elCancel, lead, log),
	})
	if err != nil {
		return fmt.Errorf("leader: %w", err)
	}
	le.Run(elCtx)
	// le.Run returns when renewal failed or elCtx ended; OnStartedLeading
	// runs on a goroutine of its own and may not have returned yet.
	gate.end()
	e.setLeading(false)
	return nil
}

// callbacks are a round's leader election callbacks: on starting to lead,
// run lead (unless the round is already over), then end the round by
// cancelling the elector's context (endRound), which releases the Lease.
func (e *Elector) callbacks(ctx context.Context, gate *roundGate, endRound context.CancelFunc, lead func(context.Context) error, log *slog.Logger) leaderelection.LeaderCallbacks {
	return leaderelection.LeaderCallbacks{
		OnStartedLeading: func(leCtx context.Context) {
			done := gate.begin(leCtx)
			if done == nil {
				return
			}
			defer close(done)
			e.lead(leCtx, ctx, lead, log)
			// Lead returned (an error, or leadership lost): end this
			// round, releasing the Lease; the next round campaigns.
			endRound()
		},
		OnStoppedLeading: func() {},
		OnNewLeader: func(id string) {
			if id != e.cfg.Identity {
				log.Info("leader observed", "leader", id)
			}
		},
	}
}

// roundGate orders a round's end after its lead: once the round is over
// no late OnStartedLeading may lead, and the round waits for a lead that
// did start to return.
type roundGate struct {
	mu       sync.Mutex
	leadDone chan struct{} // set while lead runs
	over     bool          // the round ended; a late start must not lead
}

// begin registers a lead about to start and returns the channel to close
// when it returns; nil when the round is over or leCtx is done, and lead
// must not start.
func (g *roundGate) begin(leCtx context.Context) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.over || leCtx.Err() != nil {
		return nil
	}
	g.leadDone = make(chan struct{})
	return g.leadDone
}

// end marks the round over and waits for a lead that began to return.
func (g *roundGate) end() {
	g.mu.Lock()
	g.over = true
	ch := g.leadDone
	g.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// lead runs f while this replica leads.
func (e *Elector) lead(leCtx, outer context.Context, f func(context.Context) error, log *slog.Logger) {
	ctx, cancel := context.WithCancel(leCtx)
	defer cancel()
	stopOuter := context.AfterFunc(outer, cancel)
	defer stopOuter()
	e.setLeading(true)
	defer e.setLeading(false)
	log.Info("became the leader")
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	for {
		// The watchdog: cancel at the instant IsLeader turns false, not
		// when the elector's retry loop next notices.
		e.mu.Lock()
		left := e.cfg.RenewDeadline - e.cfg.Clock.Since(e.renewed)
		e.mu.Unlock()
		timer := e.cfg.Clock.NewTimer(left)
		select {
		case err := <-done:
			timer.Stop()
			if err != nil && ctx.Err() == nil {
				log.Error("leader work failed; giving up leadership", "error", err)
			} else {
				log.Info("stopped leading")
			}
			return
		case <-timer.C():
			if !e.IsLeader() {
				log.Warn("leader lease not renewed in time; stopping leader work")
				cancel()
				<-done
				return
			}
		case <-e.renewedCh:
			timer.Stop()
		}
	}
}

func (e *Elector) setLeading(v bool) {
	e.mu.Lock()
	e.leading = v
	e.mu.Unlock()
	if v {
		e.gauge.Set(1)
	} else {
		e.gauge.Set(0)
	}
}

// renewedAt records a successful acquisition or renewal that began at t.
func (e *Elector) renewedAt(t time.Time) {
	e.mu.Lock()
	if t.After(e.renewed) {
		e.renewed = t
	}
	e.mu.Unlock()
	select {
	case e.renewedCh <- struct{}{}:
	default:
	}
}

// observedLock notes when a write of the Lease naming this replica as
// holder began and succeeded: the lease is ours for LeaseDuration from
// some instant after that, as other replicas count it.
type observedLock struct {
	resourcelock.Interface
	e *Elector
}

func (l *observedLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	start := l.e.cfg.Clock.Now()
	err := l.Interface.Create(ctx, r)
	l.observe(start, r, err)
	return err
}

func (l *observedLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	start := l.e.cfg.Clock.Now()
	err := l.Interface.Update(ctx, r)
	l.observe(start, r, err)
	return err
}

func (l *observedLock) observe(start time.Time, r resourcelock.LeaderElectionRecord, err error) {
	if err != nil {
		return
	}
	if r.HolderIdentity != l.e.cfg.Identity {
		// A release: the lease is given up.
		l.e.mu.Lock()
		l.e.renewed = time.Time{}
		l.e.mu.Unlock()
		return
	}
	l.e.renewedAt(start)
}
