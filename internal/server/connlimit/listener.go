package connlimit

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
)

// Config configures a Listener. Name, MaxConns and MaxPerSource are
// required.
type Config struct {
	// Name labels the listener's metrics and log lines ("grpc", "bundle",
	// "admin").
	Name string
	// MaxConns bounds the connections the listener holds at once.
	MaxConns int
	// MaxPerSource bounds those of one source: an IPv4 address or an
	// IPv6 /64.
	MaxPerSource int
	// ConfirmWithin, when positive, closes a connection that Confirm has
	// not named within this time of its accept. Only TCP connections
	// (whose two ends are IP addresses) can be confirmed, so only they
	// are given the deadline.
	ConfirmWithin time.Duration
	// PendingStreams, when positive, bounds the calls (HTTP/2 streams) a
	// connection awaiting Confirm may have open at once (OpenStream).
	// Every open stream holds a goroutine and buffers before the server
	// has authenticated anything: 128 streams that send headers and no
	// body cost about 2 MiB, so without this bound the connection limits
	// would not bound memory.
	PendingStreams int
	// MaxPending, when positive, bounds the connections awaiting Confirm
	// the listener holds at once: at the limit, or when MaxConns are held,
	// the oldest of them is closed to admit a new one (counted as
	// evicted), so clients that never confirm cannot shut out one that
	// does at once; only confirmed connections can fill the total. And
	// MaxPendingPerSource, when positive, bounds those of one source:
	// over it a new connection is refused at accept (reason
	// unconfirmed_source_limit). Confirmed connections count against
	// MaxConns and MaxPerSource only.
	MaxPending, MaxPendingPerSource int
	// TCPUserTimeout, when positive, is set (on Linux) on each admitted
	// TCP connection: how long sent data may go unacknowledged before
	// the kernel drops the connection. gRPC sets its keepalive timeout so
	// on a *net.TCPConn, which it no longer sees behind this wrapper.
	TCPUserTimeout time.Duration

	Logger     *slog.Logger          // nil discards
	Registerer prometheus.Registerer // nil: a private registry
	// RefusalLog and ExpiryLog pace the log lines of refusals and of
	// expired connections; nil: loglimit.NewDefault() each.
	RefusalLog, ExpiryLog *ratelimit.LogLimiter
}

// Reasons a connection is refused at accept: the label of
// trustbridge_listener_connections_refused_total.
const (
	ReasonSourceLimit            = "source_limit"             // its source holds MaxPerSource
	ReasonTotalLimit             = "total_limit"              // the listener holds MaxConns
	ReasonUnconfirmedSourceLimit = "unconfirmed_source_limit" // its source holds MaxPendingPerSource awaiting Confirm
)

// Listener is a net.Listener whose Accept closes, at once, every
// connection over its limits, and returns the others. Safe for concurrent
// use.
type Listener struct {
	net.Listener
	cfg     Config
	logger  *slog.Logger
	metrics listenerMetrics

	mu       sync.Mutex
	open     int
	bySource map[string]int
	pending  map[connKey]*conn // awaiting Confirm
	// order holds the pending connections, oldest first; pendingBySource
	// counts them by source.
	order           *list.List
	pendingBySource map[string]int
}

// New wraps ln. It starts no goroutine; a connection's deadline, when
// ConfirmWithin is set, runs on a timer.
func New(ln net.Listener, cfg Config) (*Listener, error) {
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("connlimit: listener %q: %w", cfg.Name, err)
	}
	if ln == nil {
		return nil, fmt.Errorf("connlimit: listener %q: no net.Listener", cfg.Name)
	}
	m, err := newListenerMetrics(cfg.Registerer, cfg.Name)
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.RefusalLog == nil {
		cfg.RefusalLog = ratelimit.NewDefaultLogLimiter()
	}
	if cfg.ExpiryLog == nil {
		cfg.ExpiryLog = ratelimit.NewDefaultLogLimiter()
	}
	return &Listener{
		Listener: ln, cfg: cfg, metrics: m,
		logger:   logger.With(logattr.Listener, cfg.Name),
		bySource: map[string]int{}, pending: map[connKey]*conn{},
		order: list.New(), pendingBySource: map[string]int{},
	}, nil
}

func (c Config) check() error {
	var errs []error
	if c.Name == "" {
		errs = append(errs, errors.New("a name is required"))
	}
	if c.MaxConns < 1 {
		errs = append(errs, fmt.Errorf("max connections %d: must be at least 1", c.MaxConns))
	}
	if c.MaxPerSource < 1 {
		errs = append(errs, fmt.Errorf("max connections per source %d: must be at least 1", c.MaxPerSource))
	}
	if c.ConfirmWithin < 0 {
		errs = append(errs, fmt.Errorf("confirmation deadline %s is negative", c.ConfirmWithin))
	}
	if c.MaxPending < 0 || c.MaxPendingPerSource < 0 {
		errs = append(errs, fmt.Errorf("unconfirmed connection limits %d and %d: must not be negative", c.MaxPending, c.MaxPendingPerSource))
	}
	if c.PendingStreams < 0 {
		errs = append(errs, fmt.Errorf("streams per unconfirmed connection %d is negative", c.PendingStreams))
	}
	if c.TCPUserTimeout < 0 {
		errs = append(errs, fmt.Errorf("TCP user timeout %s is negative", c.TCPUserTimeout))
	}
	return errors.Join(errs...)
}

// Accept returns the next connection within the limits. Connections over
// them are closed here and never returned, so a server's accept loop
// sees neither them nor an error for them.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if lc := l.admit(c); lc != nil {
			return lc, nil
		}
	}
}

// admit counts c in, or refuses it and returns nil. Admission, the
// choice of a connection to evict and c's place among those awaiting
// Confirm are one critical section (countIn), so concurrent Confirms,
// closes or Accepts cannot leave the listener over its limits.
func (l *Listener) admit(c net.Conn) net.Conn {
	src := sourceOf(c.RemoteAddr())
	key, confirmable := keyOf(c.RemoteAddr(), c.LocalAddr())
	awaits := l.cfg.ConfirmWithin > 0 && confirmable
	lc := &conn{Conn: c, l: l, src: src}
	reason, evict := l.countIn(lc, key, awaits)
	if reason != "" {
		l.refuse(c, src, reason)
		return nil
	}
	if evict != nil {
		l.closeEvicted(evict)
	} else {
		l.metrics.open.Inc()
	}
	l.setUserTimeout(c)
	return lc
}

// countIn is admit's critical section. It refuses lc with a reason, or
// counts it in, in the place of the pending connection it returns to
// evict if there is one, and starts lc's Confirm deadline when it awaits
// one.
func (l *Listener) countIn(lc *conn, key connKey, awaits bool) (reason string, evict *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	canEvict := awaits && l.cfg.MaxPending > 0 && l.order.Len() > 0
	if reason := l.refusalLocked(lc.src, awaits, canEvict); reason != "" {
		return reason, nil
	}
	// At the total, or at MaxPending, a connection that will await
	// Confirm takes the place of one that still does.
	if canEvict && (l.open >= l.cfg.MaxConns || len(l.pending) >= l.cfg.MaxPending) {
		evict = l.evictLocked()
	} else {
		l.open++
	}
	l.bySource[lc.src]++
	if awaits {
		l.pendLocked(lc, key)
	}
	return "", evict
}

// refusalLocked is the reason to refuse a new connection from src, or ""
// to admit it: the per-source limit first, then the per-source limit of
// those awaiting Confirm, then the total unless a pending connection can
// make room.
func (l *Listener) refusalLocked(src string, awaits, canEvict bool) string {
	switch {
	case l.bySource[src] >= l.cfg.MaxPerSource:
		return ReasonSourceLimit
	case awaits && l.cfg.MaxPendingPerSource > 0 && l.pendingBySource[src] >= l.cfg.MaxPendingPerSource:
		return ReasonUnconfirmedSourceLimit
	case l.open >= l.cfg.MaxConns && !canEvict:
		return ReasonTotalLimit
	}
	return ""
}

// evictLocked takes the victim off the pending set and marks it expired;
// the caller closes it once the lock is released.
func (l *Listener) evictLocked() *conn {
	evict := l.victimLocked()
	l.unpendLocked(evict)
	// Its place in the total goes to the new connection: its close must
	// not give it back a second time.
	evict.state, evict.handedOver = stateExpired, true
	return evict
}

// pendLocked puts lc, whose ends are key, among the connections awaiting
// Confirm and starts its deadline.
func (l *Listener) pendLocked(lc *conn, key connKey) {
	lc.key, lc.state = key, statePending
	l.pending[key] = lc
	lc.elem = l.order.PushBack(lc)
	l.pendingBySource[lc.src]++
	lc.timer = time.AfterFunc(l.cfg.ConfirmWithin, lc.expire)
}

// closeEvicted counts, logs at a bounded rate and closes a connection
// evicted to make room for a new one.
func (l *Listener) closeEvicted(evict *conn) {
	l.metrics.evicted.Inc()
	l.logger.Log(context.Background(), l.cfg.ExpiryLog.Level(slog.LevelWarn), "connection closed: made room for a new one among too many awaiting a confirming call",
		"limit", l.cfg.MaxPending, logattr.Address, addrString(evict.RemoteAddr()), "source", evict.src)
	_ = evict.Close()
}

// setUserTimeout sets TCPUserTimeout, when configured, on an admitted
// connection; where it cannot be set the connection is kept as it is.
func (l *Listener) setUserTimeout(c net.Conn) {
	if l.cfg.TCPUserTimeout > 0 {
		if err := setTCPUserTimeout(c, l.cfg.TCPUserTimeout); err != nil {
			l.logger.Debug("TCP user timeout not set", logattr.Address, addrString(c.RemoteAddr()), logattr.Error, err)
		}
	}
}

// refuse counts c, logs it at a bounded rate and closes it with a reset
// (no TIME_WAIT left behind for a flood). It counts first, so that a
// client that sees the reset finds it counted.
func (l *Listener) refuse(c net.Conn, src, reason string) {
	limit := l.cfg.MaxConns
	switch reason {
	case ReasonSourceLimit:
		limit = l.cfg.MaxPerSource
	case ReasonUnconfirmedSourceLimit:
		limit = l.cfg.MaxPendingPerSource
	}
	l.metrics.refused[reason].Inc()
	l.logger.Log(context.Background(), l.cfg.RefusalLog.Level(slog.LevelWarn), "connection refused at accept: limit reached",
		"reason", reason, "limit", limit, logattr.Address, addrString(c.RemoteAddr()), "source", src)
	if tc, ok := c.(interface{ SetLinger(int) error }); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// victimLocked is the connection awaiting Confirm to close for a new
// one: the oldest of the source that holds the most of them, so that a
// client flooding from one source (or a few) pushes out its own
// connections, not a client that has just connected to make its call.
func (l *Listener) victimLocked() *conn {
	most := 0
	for _, n := range l.pendingBySource {
		most = max(most, n)
	}
	for e := l.order.Front(); e != nil; e = e.Next() {
		if c := e.Value.(*conn); l.pendingBySource[c.src] == most {
			return c
		}
	}
	return l.order.Front().Value.(*conn)
}

// unpendLocked takes c off the pending set and stops its deadline.
func (l *Listener) unpendLocked(c *conn) {
	if l.pending[c.key] == c {
		delete(l.pending, c.key)
	}
	l.order.Remove(c.elem)
	if l.pendingBySource[c.src]--; l.pendingBySource[c.src] <= 0 {
		delete(l.pendingBySource, c.src)
	}
	c.timer.Stop()
}

// Confirm keeps the connection whose ends are remote and local (as
// peer.Peer's Addr and LocalAddr name them) past ConfirmWithin. It
// reports whether a connection awaiting confirmation was found; a nil
// Listener, an unknown or already confirmed connection find none.
func (l *Listener) Confirm(remote, local net.Addr) bool {
	if l == nil {
		return false
	}
	key, ok := keyOf(remote, local)
	if !ok {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.pending[key]
	if c == nil {
		return false
	}
	l.unpendLocked(c)
	c.state = stateConfirmed
	return true
}

// OpenStream admits a new call (an HTTP/2 stream) on the connection whose
// ends are remote and local, and returns the func to call, once, when it
// ends. On a connection awaiting Confirm at most PendingStreams calls are
// open at once; beyond them ok is false and the call should be refused.
// Confirmed connections, and those the listener does not track, are not
// limited here (the server's own per-connection stream limit applies).
func (l *Listener) OpenStream(remote, local net.Addr) (done func(), ok bool) {
	none := func() {}
	if l == nil || l.cfg.PendingStreams <= 0 {
		return none, true
	}
	key, ok := keyOf(remote, local)
	if !ok {
		return none, true
	}
	l.mu.Lock()
	c := l.pending[key]
	switch {
	case c == nil:
		l.mu.Unlock()
		return none, true
	case c.streams >= l.cfg.PendingStreams:
		l.mu.Unlock()
		l.metrics.streamsRefused.Inc()
		return none, false
	}
	c.streams++
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			c.streams--
			l.mu.Unlock()
		})
	}, true
}

// release counts c out; once per connection. An evicted connection's
// place in the total went to the connection admitted in its stead.
func (l *Listener) release(c *conn) {
	l.mu.Lock()
	if !c.handedOver {
		l.open--
	}
	if l.bySource[c.src]--; l.bySource[c.src] <= 0 {
		delete(l.bySource, c.src)
	}
	if c.state == statePending {
		l.unpendLocked(c)
	}
	c.state = stateClosed
	handedOver := c.handedOver
	l.mu.Unlock()
	if !handedOver {
		l.metrics.open.Dec()
	}
}

// States of a connection's deadline; guarded by Listener.mu.
const (
	stateNone      = iota // no deadline
	statePending          // awaiting Confirm
	stateConfirmed        // confirmed in time
	stateExpired          // closed for want of confirmation
	stateClosed           // closed
)

// conn is an admitted connection, released on its first Close.
type conn struct {
	net.Conn
	l    *Listener
	src  string
	once sync.Once

	// Guarded by l.mu.
	key     connKey
	state   int
	timer   *time.Timer
	elem    *list.Element // in Listener.order while pending
	streams int           // open calls, counted while pending
	// handedOver marks an evicted connection whose place in the total
	// went to the one admitted in its stead (guarded by l.mu).
	handedOver bool
}

func (c *conn) Close() error {
	c.once.Do(func() { c.l.release(c) })
	return c.Conn.Close()
}

// expire closes c unless it was confirmed or closed meanwhile.
func (c *conn) expire() {
	l := c.l
	l.mu.Lock()
	if c.state != statePending {
		l.mu.Unlock()
		return
	}
	c.state = stateExpired
	l.unpendLocked(c)
	l.mu.Unlock()
	l.metrics.expired.Inc()
	l.logger.Log(context.Background(), l.cfg.ExpiryLog.Level(slog.LevelInfo), "connection closed: no call confirmed it in time",
		"within", l.cfg.ConfirmWithin, logattr.Address, addrString(c.RemoteAddr()), "source", c.src)
	_ = c.Close()
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}
