package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/trustbridge/trustbridge/internal/server/servertest"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
)

// BenchmarkLegitUnderConnFlood measures legitimate requests while one
// address (127.0.0.1) floods their listener with idle connections as in
// issue 32 item 2, against a server with the default limits, and reports
// their p99 latency under the flood over their p99 idle (x-idle). The
// phases alternate every few requests within one run, so machine load
// weighs on both alike. The flood runs in the same process, on the same
// cores as the server: 8 dialers open connections (TLS, the HTTP/2
// preface, then nothing) as fast as they can and keep every one the
// server accepts. A flood phase is measured once the address holds its
// share and the server has refused one more (the steady state: every new
// connection is refused at accept); the idle phase starts once the
// dialers have stopped and the held connections are closed.
//
//   - grpc: the legitimate request is a workload renewing its X509-SVID
//     (CreateCertificate) on a warm connection from 127.0.0.10.
//   - bundle: a peer's GET of the bundle document over a kept-alive
//     connection from 127.0.0.11.
//
// Also reported: legit-failed-% (legitimate requests that failed),
// refused/legit-req (flood connections refused per legitimate request
// under the flood) and held (the most flood connections held at once: the
// listener's per-source limit).
func BenchmarkLegitUnderConnFlood(b *testing.B) {
	for _, target := range []string{"grpc", "bundle"} {
		b.Run(target, func(b *testing.B) {
			needOpenFiles(b, 4096)
			ft := startFloodTarget(b, nil)
			addr, call := legitRequest(b, ft, target)
			f := &connFlood{addr: addr, local: "127.0.0.1"}
			defer f.set(false)

			idle, flooded, failed := alternate(b, 50, f.set, func(int) error { return call() })
			b.ReportMetric(100*float64(failed)/float64(b.N), "legit-failed-%")
			b.ReportMetric(float64(f.maxHeld), "held")
			if reportP99(b, idle, flooded, "flood") {
				b.ReportMetric(float64(f.refused.Load())/float64(len(flooded)), "refused/legit-req")
			}
		})
	}
}

// legitRequest is target's listener address and one legitimate request
// to it, made once here to warm its connection.
func legitRequest(b *testing.B, ft *floodTarget, target string) (string, func() error) {
	b.Helper()
	var call func() error
	addr := ft.grpc
	switch target {
	case "grpc":
		svid, csr := legitSVID(b, ft.attackTarget, "127.0.0.10")
		c := dialFrom(b, ft.grpc, "127.0.0.10", svid)
		req := &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600}
		call = func() error {
			_, err := c.CreateCertificate(context.Background(), req)
			return err
		}
	default:
		addr = ft.bundle
		c := fromClient("127.0.0.11")
		b.Cleanup(c.CloseIdleConnections)
		call = func() error {
			resp, err := c.Get("https://" + ft.bundle + "/")
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if _, err := io.Copy(io.Discard, resp.Body); err != nil {
				return err
			}
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("bundle endpoint: %s", resp.Status)
			}
			return nil
		}
	}
	if err := call(); err != nil {
		b.Fatal(err)
	}
	return addr, call
}

// connFlood opens idle connections from local to addr while on.
type connFlood struct {
	addr, local string
	on          bool
	stop        chan struct{}
	wg          sync.WaitGroup
	refused     atomic.Int64

	mu       sync.Mutex
	held     []net.Conn
	maxHeld  int
	steady   chan struct{} // closed at the phase's first refusal
	isSteady bool
}

// set starts the flood's dialers and returns once the server refuses
// them, or stops them and closes every connection they hold, with a
// reset so that no port stays in TIME_WAIT.
func (f *connFlood) set(on bool) {
	if on == f.on {
		return
	}
	f.on = on
	if on {
		f.stop = make(chan struct{})
		f.steady, f.isSteady = make(chan struct{}), false
		for range 8 {
			f.wg.Go(f.dial)
		}
		<-f.steady
		return
	}
	close(f.stop)
	f.wg.Wait()
	for _, c := range f.held {
		if tc, ok := c.(*tls.Conn); ok {
			if raw, ok := tc.NetConn().(*net.TCPConn); ok {
				_ = raw.SetLinger(0)
			}
		}
		_ = c.Close()
	}
	f.held = nil
}

func (f *connFlood) dial() {
	for {
		select {
		case <-f.stop:
			return
		default:
		}
		c := servertest.DialIdleH2(f.addr, f.local)
		f.mu.Lock()
		if c == nil {
			f.refused.Add(1)
			if !f.isSteady {
				f.isSteady = true
				close(f.steady)
			}
		} else {
			f.held = append(f.held, c)
			f.maxHeld = max(f.maxHeld, len(f.held))
		}
		f.mu.Unlock()
	}
}
