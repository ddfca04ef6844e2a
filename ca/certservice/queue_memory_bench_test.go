package certservice_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
)

// queueClientEnv, set in the environment of this test binary, makes
// BenchmarkQueuedRequestMemory the client side of the measurement:
// "addr conns calls csrBytes rootsPEMfile".
const queueClientEnv = "TRUSTBRIDGE_QUEUE_MEMORY_CLIENT"

// BenchmarkQueuedRequestMemory measures what one request waiting in the
// signing queue costs the server (docs/operations.md, "Sizing for
// bursts"): the heap and stacks the server process holds with n
// requests queued, less what it held with the same connections open and
// idle, over n. The clients run in a child process (this test binary
// again), so only the server's side is counted. A typical CSR (P-256,
// about 500 bytes) and the largest one accepted (ca.MaxCSRSize; it is
// not parsed while it waits) are measured.
func BenchmarkQueuedRequestMemory(b *testing.B) {
	if env := os.Getenv(queueClientEnv); env != "" {
		queueMemoryClient(b, env)
		return
	}
	for _, tc := range []struct {
		name     string
		calls    int
		csrBytes int
	}{
		{"csr=typical", 10000, 0},
		{"csr=max", 1000, ca.MaxCSRSize},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				per := measureQueuedMemory(b, 100, tc.calls, tc.csrBytes)
				b.ReportMetric(float64(per), "bytes/waiting-request")
			}
		})
	}
}

// measureQueuedMemory has a child process open conns connections, then
// make calls requests spread over them, all of which wait behind the one
// slot, held in the signer by a request of the benchmark's own; it
// returns the server's heap and stacks per
// request, past those of the idle connections.
func measureQueuedMemory(b *testing.B, conns, calls, csrBytes int) uint64 {
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	entered := make(chan struct{}, 1)
	f := newFixture(b, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.Concurrency, cfg.QueueSize = 1, calls*(ca.MaxCSRSize/1024) // room for the largest
		cfg.Authenticator = fakeTokens
		cfg.Signer = certservice.SignerFunc(func(p ca.X509SVIDParams) (*ca.Issued, error) {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-release
			return nil, errors.New("measurement over")
		})
	})
	// Registered after the fixture's: runs first, so that its stop
	// finds no handler held.
	b.Cleanup(free)
	allQueued := make(chan struct{})
	var queued atomic.Int64
	f.svc.OnQueuedForTest(func() {
		if queued.Add(1) == int64(calls) {
			close(allQueued)
		}
	})
	roots := b.TempDir() + "/roots.pem"
	if err := os.WriteFile(roots, pemCerts(f.authority.Bundle().X509Bundle().X509Authorities()), 0o600); err != nil {
		b.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^BenchmarkQueuedRequestMemory$", "-test.benchtime=1x")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d %d %s", queueClientEnv, f.addr, conns, calls, csrBytes, roots))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	// The child prints the benchmark's header lines first.
	lines := bufio.NewScanner(stdout)
	for lines.Scan() && lines.Text() != "connected" {
	}
	if lines.Text() != "connected" {
		b.Fatalf("client never connected: %v", lines.Err())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	// The one slot is held by a request of our own: the child's CSRs
	// may be junk (the largest), refused once they leave the queue.
	holder := f.client(b, nil, goodToken)
	go func() {
		_, _ = holder.CreateCertificate(context.Background(), &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(b)})
	}()
	<-entered
	idle := serverMemory()
	if _, err := io.WriteString(stdin, "call\n"); err != nil {
		b.Fatal(err)
	}
	<-allQueued
	busy := serverMemory()
	if busy < idle {
		b.Fatalf("memory fell from %d to %d bytes with %d requests queued", idle, busy, calls)
	}
	return (busy - idle) / uint64(calls)
}

// serverMemory is the heap and goroutine stacks in use after a full
// collection.
func serverMemory() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

// queueMemoryClient is the child process: it opens the connections,
// says "connected", and on a line from its parent makes the calls, which
// wait until it is killed.
func queueMemoryClient(b *testing.B, env string) {
	var addr, roots string
	var conns, calls, csrBytes int
	if _, err := fmt.Sscan(env, &addr, &conns, &calls, &csrBytes, &roots); err != nil {
		b.Fatalf("%s=%q: %v", queueClientEnv, env, err)
	}
	pemRoots, err := os.ReadFile(roots)
	if err != nil {
		b.Fatal(err)
	}
	bundle, err := x509bundle.Parse(td, pemRoots)
	if err != nil {
		b.Fatal(err)
	}
	tlsCfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // verified in VerifyConnection as an X509-SVID
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, _, err := x509svid.Verify(cs.PeerCertificates, bundle)
			return err
		},
	}
	clients := make([]securityv1alpha1.IstioCertificateServiceClient, conns)
	for i := range clients {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)), grpc.WithPerRPCCredentials(bearer(goodToken)))
		if err != nil {
			b.Fatal(err)
		}
		conn.Connect()
		for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
			if !conn.WaitForStateChange(context.Background(), s) {
				b.Fatal("connection never ready")
			}
		}
		clients[i] = securityv1alpha1.NewIstioCertificateServiceClient(conn)
	}
	csr := freshCSR(b)
	if csrBytes > 0 {
		csr = strings.Repeat("A", csrBytes)
	}
	fmt.Println("connected")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		b.Fatal(err)
	}
	for i := range calls {
		go func() {
			_, _ = clients[i%conns].CreateCertificate(context.Background(), &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
		}()
	}
	select {} // until killed
}

func pemCerts(certs []*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}
