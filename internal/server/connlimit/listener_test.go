package connlimit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/trustbridge/trustbridge/internal/ratelimit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeListener hands out the connections offered to it.
type fakeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newFakeListener() *fakeListener {
	return &fakeListener{conns: make(chan net.Conn, 64), closed: make(chan struct{})}
}

// Accept hands out what was offered before it reports being closed.
func (f *fakeListener) Accept() (net.Conn, error) {
	select {
	case c := <-f.conns:
		return c, nil
	default:
	}
	select {
	case c := <-f.conns:
		return c, nil
	case <-f.closed:
		return nil, net.ErrClosed
	}
}

func (f *fakeListener) Close() error {
	f.once.Do(func() { close(f.closed) })
	return nil
}

func (f *fakeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 443} }

// fakeConn is the server end of a pipe with the addresses of a TCP
// connection from remote, and a record of how it was closed.
type fakeConn struct {
	net.Conn
	remote, local net.Addr
	client        net.Conn
	mu            sync.Mutex
	closes        int
	lingered      bool
}

func (c *fakeConn) RemoteAddr() net.Addr { return c.remote }
func (c *fakeConn) LocalAddr() net.Addr  { return c.local }

func (c *fakeConn) SetLinger(sec int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lingered = sec == 0
	return nil
}

func (c *fakeConn) Close() error {
	c.mu.Lock()
	c.closes++
	c.mu.Unlock()
	return c.Conn.Close()
}

func (c *fakeConn) closeCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closes
}

var localAddr = &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 443}

// newConn is a connection from remote: "ip:port", or anything else for
// an address that is not IP.
func newConn(t testing.TB, remote string) *fakeConn {
	t.Helper()
	server, client := net.Pipe()
	var ra net.Addr = pipeAddr(remote)
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		ra = net.TCPAddrFromAddrPort(ap)
	}
	c := &fakeConn{Conn: server, client: client, remote: ra, local: localAddr}
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return c
}

type pipeAddr string

func (a pipeAddr) Network() string { return "pipe" }
func (a pipeAddr) String() string  { return string(a) }

func newListener(t testing.TB, cfg Config) (*Listener, *fakeListener, *prometheus.Registry) {
	t.Helper()
	f := newFakeListener()
	reg := prometheus.NewRegistry()
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	cfg.Registerer = reg
	l, err := New(f, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l, f, reg
}

// acceptAll offers conns to l in order and returns those Accept returned.
func acceptAll(t *testing.T, l *Listener, f *fakeListener, conns []*fakeConn) []net.Conn {
	t.Helper()
	for _, c := range conns {
		f.conns <- c
	}
	_ = f.Close()
	var out []net.Conn
	for {
		c, err := l.Accept()
		if err != nil {
			require.ErrorIs(t, err, net.ErrClosed)
			return out
		}
		out = append(out, c)
	}
}

func refused(t *testing.T, l *Listener, reason string) float64 {
	t.Helper()
	return testutil.ToFloat64(l.metrics.refused[reason])
}

func TestAcceptLimits(t *testing.T) {
	tests := []struct {
		name              string
		max, perSource    int
		remotes           []string
		accepted          []int // indexes into remotes
		bySource, byTotal float64
	}{
		{"per source", 10, 2, []string{"192.0.2.1:1", "192.0.2.1:2", "192.0.2.1:3", "192.0.2.2:1"}, []int{0, 1, 3}, 1, 0},
		{"total", 3, 5, []string{"192.0.2.1:1", "192.0.2.2:1", "192.0.2.3:1", "192.0.2.4:1"}, []int{0, 1, 2}, 0, 1},
		{"an IPv6 /64 is one source", 10, 2,
			[]string{"[2001:db8::1]:1", "[2001:db8::2]:1", "[2001:db8::ffff:1:2:3]:1", "[2001:db8:0:1::1]:1"}, []int{0, 1, 3}, 1, 0},
		{"an IPv6 zone does not make a new source", 10, 1, []string{"[fe80::1%eth0]:1", "[fe80::2%eth1]:1"}, []int{0}, 1, 0},
		{"IPv4-mapped is its IPv4 address", 10, 1, []string{"[::ffff:192.0.2.1]:1", "192.0.2.1:2"}, []int{0}, 1, 0},
		{"the source's limit names the refusal when both are reached", 1, 1, []string{"192.0.2.1:1", "192.0.2.1:2", "192.0.2.2:1"}, []int{0}, 1, 1},
		{"addresses that are not IP share one budget", 10, 1, []string{"@", "@"}, []int{0}, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, f, _ := newListener(t, Config{MaxConns: tt.max, MaxPerSource: tt.perSource})
			var conns []*fakeConn
			for _, r := range tt.remotes {
				conns = append(conns, newConn(t, r))
			}
			got := acceptAll(t, l, f, conns)
			require.Len(t, got, len(tt.accepted))
			for i, idx := range tt.accepted {
				assert.Same(t, conns[idx], got[i].(*conn).Conn, "accepted %d", i)
			}
			for i, c := range conns {
				wasAccepted := false
				for _, idx := range tt.accepted {
					wasAccepted = wasAccepted || idx == i
				}
				if !wasAccepted {
					assert.Equal(t, 1, c.closeCount(), "%s refused: closed at accept", tt.remotes[i])
					assert.True(t, c.lingered, "%s refused with a reset", tt.remotes[i])
				} else {
					assert.Zero(t, c.closeCount(), "%s accepted: left open", tt.remotes[i])
				}
			}
			assert.Equal(t, tt.bySource, refused(t, l, ReasonSourceLimit))
			assert.Equal(t, tt.byTotal, refused(t, l, ReasonTotalLimit))
			assert.Equal(t, float64(len(tt.accepted)), testutil.ToFloat64(l.metrics.open))
			for _, c := range got {
				require.NoError(t, c.Close())
			}
			assert.Zero(t, testutil.ToFloat64(l.metrics.open))
			assert.Empty(t, l.bySource, "every source released")
		})
	}
}

// A connection is released on its first Close only: closing it again
// gives no one a second slot.
func TestReleaseOnceOnClose(t *testing.T) {
	l, _, _ := newListener(t, Config{MaxConns: 10, MaxPerSource: 2})
	a1 := l.admit(newConn(t, "192.0.2.1:1"))
	a2 := l.admit(newConn(t, "192.0.2.1:2"))
	require.NotNil(t, a1)
	require.NotNil(t, a2)
	assert.Nil(t, l.admit(newConn(t, "192.0.2.1:3")), "the source is full")

	require.NoError(t, a1.Close())
	_ = a1.Close()
	assert.Equal(t, 2, a1.(*conn).Conn.(*fakeConn).closeCount(), "every Close reaches the connection")

	a3 := l.admit(newConn(t, "192.0.2.1:4"))
	require.NotNil(t, a3, "the first Close freed a slot")
	assert.Nil(t, l.admit(newConn(t, "192.0.2.1:5")), "the second freed none")
	assert.Equal(t, float64(2), testutil.ToFloat64(l.metrics.open))
	assert.Equal(t, float64(2), refused(t, l, ReasonSourceLimit))
	require.NoError(t, a2.Close())
	require.NoError(t, a3.Close())
	assert.Zero(t, l.open)
	assert.Empty(t, l.bySource)
}

// Refusals are logged at Warn while the budget lasts, then at Debug, and
// counted in full either way.
func TestRefusalLogAndMetric(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l, f, reg := newListener(t, Config{Name: "bundle", MaxConns: 100, MaxPerSource: 1, Logger: logger, RefusalLog: ratelimit.NewLogLimiter(0, 2)})
	conns := []*fakeConn{newConn(t, "192.0.2.1:1")}
	for i := range 5 {
		conns = append(conns, newConn(t, fmt.Sprintf("192.0.2.1:%d", 2+i)))
	}
	got := acceptAll(t, l, f, conns)
	require.Len(t, got, 1)
	defer got[0].Close()

	levels := map[string]int{}
	dec := json.NewDecoder(&buf)
	for {
		var rec map[string]any
		if err := dec.Decode(&rec); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err)
		}
		levels[rec["level"].(string)]++
		assert.Equal(t, "connection refused at accept: limit reached", rec["msg"])
		assert.Equal(t, "bundle", rec["listener"])
		assert.Equal(t, ReasonSourceLimit, rec["reason"])
		assert.Equal(t, "192.0.2.1", rec["source"])
		assert.EqualValues(t, 1, rec["limit"])
	}
	assert.Equal(t, map[string]int{"WARN": 2, "DEBUG": 3}, levels)

	want := `
# HELP trustbridge_listener_connections_open Connections a TCP listener holds: accepted within its limits and not yet closed.
# TYPE trustbridge_listener_connections_open gauge
trustbridge_listener_connections_open{listener="bundle"} 1
`
	assert.NoError(t, testutil.GatherAndCompare(reg, bytes.NewBufferString(want), "trustbridge_listener_connections_open"))
	n, err := testutil.GatherAndCount(reg, "trustbridge_listener_connections_refused_total")
	require.NoError(t, err)
	assert.Equal(t, 3, n, "every reason is served from the start")
	assert.Equal(t, float64(5), refused(t, l, ReasonSourceLimit))
	assert.Zero(t, refused(t, l, ReasonTotalLimit))
}

// Listeners of one process share the metrics on its registry, each with
// its own series.
func TestListenersShareARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	var ls []*Listener
	for _, name := range []string{"grpc", "bundle"} {
		l, err := New(newFakeListener(), Config{Name: name, MaxConns: 1, MaxPerSource: 1, Registerer: reg})
		require.NoError(t, err)
		ls = append(ls, l)
	}
	c := ls[0].admit(newConn(t, "192.0.2.1:1"))
	require.NotNil(t, c)
	defer c.Close()
	assert.Nil(t, ls[0].admit(newConn(t, "192.0.2.1:2")))
	assert.Equal(t, float64(1), refused(t, ls[0], ReasonSourceLimit))
	assert.Zero(t, refused(t, ls[1], ReasonSourceLimit))
	n, err := testutil.GatherAndCount(reg, "trustbridge_listener_connections_open")
	require.NoError(t, err)
	assert.Equal(t, 2, n)

	// A collector of another shape under the name is an error, not a
	// silent second metric.
	other := prometheus.NewRegistry()
	other.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "trustbridge_listener_connections_open", Help: "x"}))
	_, err = New(newFakeListener(), Config{Name: "grpc", MaxConns: 1, MaxPerSource: 1, Registerer: other})
	assert.ErrorContains(t, err, "connlimit:")
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no name", Config{MaxConns: 1, MaxPerSource: 1}, "a name is required"},
		{"no total", Config{Name: "x", MaxPerSource: 1}, "max connections 0: must be at least 1"},
		{"negative per source", Config{Name: "x", MaxConns: 1, MaxPerSource: -1}, "max connections per source -1"},
		{"negative deadline", Config{Name: "x", MaxConns: 1, MaxPerSource: 1, ConfirmWithin: -time.Second}, "confirmation deadline -1s is negative"},
		{"negative user timeout", Config{Name: "x", MaxConns: 1, MaxPerSource: 1, TCPUserTimeout: -time.Second}, "TCP user timeout -1s is negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(newFakeListener(), tt.cfg)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Contains(t, err.Error(), "connlimit: listener")
		})
	}
	_, err := New(nil, Config{Name: "x", MaxConns: 1, MaxPerSource: 1})
	assert.ErrorContains(t, err, "no net.Listener")
}

// closedByServer reports whether the server closed c's pipe: the client
// end's read fails. Inside a synctest bubble it returns once every
// goroutine is blocked.
func closedByServer(c *fakeConn) bool {
	done := make(chan struct{})
	go func() {
		var b [1]byte
		_, _ = c.client.Read(b[:])
		close(done)
	}()
	synctest.Wait()
	select {
	case <-done:
		return true
	default:
		// Unblock the reader; the test is over with this connection.
		_ = c.client.Close()
		<-done
		return false
	}
}

func TestConfirmWithin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _, _ := newListener(t, Config{MaxConns: 10, MaxPerSource: 10, ConfirmWithin: 10 * time.Second})
		confirmed, idle, closed, notIP := newConn(t, "192.0.2.1:1"), newConn(t, "192.0.2.2:1"), newConn(t, "192.0.2.3:1"), newConn(t, "@")
		var admitted []net.Conn
		for _, c := range []*fakeConn{confirmed, idle, closed, notIP} {
			a := l.admit(c)
			require.NotNil(t, a)
			admitted = append(admitted, a)
		}
		time.Sleep(5 * time.Second) // the bubble's clock: no real wait
		assert.True(t, l.Confirm(confirmed.RemoteAddr(), confirmed.LocalAddr()))
		assert.False(t, l.Confirm(confirmed.RemoteAddr(), confirmed.LocalAddr()), "confirmed once")
		assert.False(t, l.Confirm(idle.RemoteAddr(), &net.TCPAddr{IP: net.IPv4(10, 0, 0, 2), Port: 443}), "another local end is another connection")
		assert.False(t, l.Confirm(notIP.RemoteAddr(), notIP.LocalAddr()), "a connection that is not IP cannot be confirmed")
		require.NoError(t, admitted[2].Close())

		time.Sleep(5*time.Second + time.Nanosecond)
		synctest.Wait()
		assert.True(t, closedByServer(idle), "closed at its deadline")
		assert.Equal(t, 1, idle.closeCount())
		assert.False(t, l.Confirm(idle.RemoteAddr(), idle.LocalAddr()), "too late")
		assert.False(t, closedByServer(confirmed), "a confirmed connection stays")
		assert.False(t, closedByServer(notIP), "a connection that cannot be confirmed has no deadline")
		assert.Equal(t, float64(1), testutil.ToFloat64(l.metrics.expired), "only the idle connection expired")
		assert.Equal(t, float64(2), testutil.ToFloat64(l.metrics.open))
		assert.Empty(t, l.pending)

		require.NoError(t, admitted[0].Close())
		require.NoError(t, admitted[3].Close())
		assert.Zero(t, l.open)
	})
}

// A connection awaiting confirmation may have PendingStreams calls open
// at once; a call's end makes room again, and once confirmed (or when the
// listener does not track the connection) calls are not limited here.
func TestOpenStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _, _ := newListener(t, Config{MaxConns: 10, MaxPerSource: 10, ConfirmWithin: time.Minute, PendingStreams: 2})
		c, other := newConn(t, "192.0.2.1:1"), newConn(t, "192.0.2.2:1")
		for _, fc := range []*fakeConn{c, other} {
			a := l.admit(fc)
			require.NotNil(t, a)
			t.Cleanup(func() { _ = a.Close() })
		}
		open := func(fc *fakeConn) (func(), bool) { return l.OpenStream(fc.RemoteAddr(), fc.LocalAddr()) }
		done1, ok := open(c)
		require.True(t, ok)
		_, ok = open(c)
		require.True(t, ok)
		_, ok = open(c)
		assert.False(t, ok, "a third call before any succeeded")
		_, ok = open(other)
		assert.True(t, ok, "another connection has its own share")
		assert.Equal(t, float64(1), testutil.ToFloat64(l.metrics.streamsRefused))

		done1()
		done1() // once only
		_, ok = open(c)
		assert.True(t, ok, "an ended call makes room")
		_, ok = open(c)
		assert.False(t, ok, "ending one call twice frees one slot")

		require.True(t, l.Confirm(c.RemoteAddr(), c.LocalAddr()))
		for range 10 {
			_, ok = open(c)
			require.True(t, ok, "a confirmed connection's calls are not limited here")
		}
		_, ok = l.OpenStream(&net.TCPAddr{IP: net.IPv4(198, 51, 100, 1), Port: 9}, localAddr)
		assert.True(t, ok, "a connection the listener does not track")
		var nl *Listener
		_, ok = nl.OpenStream(c.RemoteAddr(), c.LocalAddr())
		assert.True(t, ok, "no listener, no limit")
	})
}

// Connections awaiting Confirm are bounded apart from confirmed ones: per
// source they are refused at accept over MaxPendingPerSource; in all, the
// oldest is closed to admit a new one at MaxPending, so clients that never
// confirm cannot shut out one that confirms at once. Confirmed
// connections no longer count against either.
func TestPendingLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _, _ := newListener(t, Config{MaxConns: 100, MaxPerSource: 100, ConfirmWithin: time.Minute, MaxPending: 3, MaxPendingPerSource: 2})
		a1, a2, a3 := newConn(t, "192.0.2.1:1"), newConn(t, "192.0.2.1:2"), newConn(t, "192.0.2.1:3")
		require.NotNil(t, l.admit(a1))
		require.NotNil(t, l.admit(a2))
		assert.Nil(t, l.admit(a3), "a third unconfirmed connection from one source")
		assert.Equal(t, float64(1), refused(t, l, ReasonUnconfirmedSourceLimit))
		require.True(t, l.Confirm(a1.RemoteAddr(), a1.LocalAddr()))
		a4 := newConn(t, "192.0.2.1:4")
		require.NotNil(t, l.admit(a4), "a confirmed connection makes room in its source's share")

		b1, c1 := newConn(t, "198.51.100.1:1"), newConn(t, "203.0.113.1:1")
		require.NotNil(t, l.admit(b1))
		synctest.Wait()
		assert.False(t, closedByServer(a2), "three awaiting: a2, a4, b1")
		require.NotNil(t, l.admit(c1), "a fourth awaiting one is admitted")
		synctest.Wait()
		assert.True(t, closedByServer(a2), "the oldest awaiting connection made room")
		assert.Equal(t, 1, a2.closeCount())
		assert.False(t, closedByServer(a1), "a confirmed connection is never evicted")
		assert.Equal(t, float64(1), testutil.ToFloat64(l.metrics.evicted))
		assert.False(t, l.Confirm(a2.RemoteAddr(), a2.LocalAddr()), "an evicted connection cannot be confirmed")
		assert.Equal(t, [3]int{3, 3, 3}, pendingCounts(l), "a4, b1 and c1 await, in order, from three sources")

		time.Sleep(time.Minute + time.Nanosecond) // the bubble's clock
		synctest.Wait()
		assert.Equal(t, [3]int{}, pendingCounts(l), "the rest expired")
		assert.Equal(t, float64(3), testutil.ToFloat64(l.metrics.expired))
	})
}

// The connection evicted is the oldest of the source holding the most
// awaiting Confirm: a flood from one source pushes out its own, not the
// older connection of a client elsewhere.
func TestEvictsFromHeaviestSource(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _, _ := newListener(t, Config{MaxConns: 100, MaxPerSource: 100, ConfirmWithin: time.Minute, MaxPending: 4, MaxPendingPerSource: 10})
		x := newConn(t, "192.0.2.1:1")
		ys := []*fakeConn{newConn(t, "198.51.100.1:1"), newConn(t, "198.51.100.1:2"), newConn(t, "198.51.100.1:3")}
		for _, c := range append([]*fakeConn{x}, ys...) {
			require.NotNil(t, l.admit(c))
		}
		require.NotNil(t, l.admit(newConn(t, "203.0.113.1:1")))
		synctest.Wait()
		assert.False(t, closedByServer(x), "the oldest, but its source holds one")
		assert.True(t, closedByServer(ys[0]), "the oldest of the heaviest source")
		assert.False(t, closedByServer(ys[1]))
		assert.Equal(t, [3]int{4, 4, 3}, pendingCounts(l))
		l.mu.Lock()
		open := l.open
		l.mu.Unlock()
		assert.Equal(t, 4, open, "the evicted connection's place went to the new one")
	})
}

// pendingCounts reads, under the listener's lock, how many connections
// await Confirm, how many are in the eviction order, and from how many
// sources.
func pendingCounts(l *Listener) [3]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return [3]int{len(l.pending), l.order.Len(), len(l.pendingBySource)}
}

// At the total, a new connection evicts the oldest one awaiting Confirm,
// never a confirmed one; with none awaiting it is refused.
func TestTotalEvictsUnconfirmed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _, _ := newListener(t, Config{MaxConns: 2, MaxPerSource: 10, ConfirmWithin: time.Minute, MaxPending: 2, MaxPendingPerSource: 2})
		a, b, c, d := newConn(t, "192.0.2.1:1"), newConn(t, "192.0.2.2:1"), newConn(t, "192.0.2.3:1"), newConn(t, "192.0.2.4:1")
		require.NotNil(t, l.admit(a))
		require.NotNil(t, l.admit(b))
		require.True(t, l.Confirm(a.RemoteAddr(), a.LocalAddr()))
		require.NotNil(t, l.admit(c), "the total is held, but b awaits: it makes room")
		synctest.Wait()
		assert.True(t, closedByServer(b))
		assert.False(t, closedByServer(a))
		assert.Equal(t, float64(2), testutil.ToFloat64(l.metrics.open))
		require.True(t, l.Confirm(c.RemoteAddr(), c.LocalAddr()))
		assert.Nil(t, l.admit(d), "two confirmed connections fill the total")
		assert.Equal(t, float64(1), refused(t, l, ReasonTotalLimit))
		assert.Equal(t, float64(1), testutil.ToFloat64(l.metrics.evicted))
	})
}

// Confirm on a nil Listener (a server without limits) does nothing.
func TestConfirmNil(t *testing.T) {
	var l *Listener
	assert.False(t, l.Confirm(&net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 1}, localAddr))
}

// Connections admitted, confirmed, expired and closed from many
// goroutines at once leave the counts at zero (run with -race).
func TestConcurrentAdmitAndClose(t *testing.T) {
	l, _, _ := newListener(t, Config{MaxConns: 50, MaxPerSource: 20, ConfirmWithin: time.Millisecond})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				c := newConn(t, fmt.Sprintf("192.0.2.%d:%d", g%3, i+1))
				a := l.admit(c)
				if a == nil {
					continue
				}
				if i%2 == 0 {
					l.Confirm(c.RemoteAddr(), c.LocalAddr())
				}
				_ = a.Close()
			}
		})
	}
	wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	assert.Zero(t, l.open)
	assert.Empty(t, l.bySource)
	assert.Empty(t, l.pending)
	assert.Zero(t, testutil.ToFloat64(l.metrics.open))
}
