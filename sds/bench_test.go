package sds_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
	"github.com/trustbridge/trustbridge/sds"
)

// The SDS scale benchmarks answer the two goals for 10,000
// concurrent streams on one server, each against a bare grpc-go
// bidirectional stream service measured in the same run (sub-benchmark
// "baseline-grpc"):
//
//   - BenchmarkSDSStreams: heap held per open stream once every stream has
//     its first ROOTCA (heap-B/stream, goal at most 3x the baseline's);
//   - BenchmarkSDSFanout: time from publishing a new root until every
//     stream has ACKed it (ns/op, goal at most 2x the baseline's), and
//     BenchmarkSDSFanoutInterleaved, the same ratio measured so that load
//     from elsewhere on the machine falls on both servers alike.
//
// Harness. One grpc.Server on 127.0.0.1:0 without TLS (handshakes are not
// what is measured), and the clients in a child process (this test binary
// re-run as TestSDSBenchClients), so that the heap measured in the
// benchmark process is the server's alone: in one process the clients'
// heap, the same for both servers, would pull the ratio towards 1. The
// clients spread their streams over connections of benchStreamsPerConn
// streams each, sending node, ROOTCA and the SDS type on the first request
// and an ACK (version and nonce of the response) to every response, as
// Envoy does. A stream interceptor on the server, the same for both
// services, counts a stream as done for a round when the service's handler
// reads the ACK of the last response it sent in that round: "ACKed" means
// received back by the server, which sees it only after the client got the
// response and answered.
//
// The baseline is what any server needs for this: per stream, the handler
// goroutine sends the current response and waits for a broadcast (a
// channel closed on publication, like sds.Trust.Changed), a second
// goroutine reads the client's requests. It sends the same resource bytes
// as sds for ROOTCA (TestSDSStreamHarness checks that), marshalled once
// per publication and shared by every stream.

const (
	// benchStreamsPerConn: a central SDS server sees one connection per
	// Envoy with a few streams each, but 10,000 loopback connections would
	// measure grpc-go's per-connection buffers and goroutines, the same
	// for both servers, more than per-stream state, and need 10,000 file
	// descriptors on each side. 100 streams per connection keep that cost
	// (about 64 KiB of buffers per server connection, under 700 bytes per
	// stream) in both measurements without drowning the difference.
	benchStreamsPerConn = 100
	// benchRoundTimeout bounds one round (all streams opened, or one
	// fan-out), so that a broken server fails the benchmark instead of
	// hanging it.
	benchRoundTimeout = 5 * time.Minute
	// envBenchClients, when set, makes TestSDSBenchClients the clients of
	// a benchmark: "address method streams".
	envBenchClients = "TRUSTBRIDGE_SDS_BENCH_CLIENTS"
	// envBenchServer, when set, makes TestSDSBenchServer a server of
	// BenchmarkSDSFanoutInterleaved: "target streams", target one of
	// benchTargets' names. It prints benchReady once its streams are
	// open, then benchPushed and nanoseconds for each publication.
	envBenchServer = "TRUSTBRIDGE_SDS_BENCH_SERVER"
	benchReady     = "sdsbench: ready"
	benchPushed    = "sdsbench: pushed"

	secretTypeURL  = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
	baselineMethod = "/trustbridge.bench.Baseline/Stream"
	sdsMethod      = secretv3.SecretDiscoveryService_StreamSecrets_FullMethodName
)

var benchTD = spiffeid.RequireTrustDomainFromString("example.org")

// bidiStream describes a bidirectional stream on the client side, for
// both services: the clients are the same code whichever server they
// talk to.
var bidiStream = grpc.StreamDesc{StreamName: "Stream", ServerStreams: true, ClientStreams: true}

// benchTarget is one of the two servers compared.
type benchTarget struct {
	name   string
	method string
	new    func(tb testing.TB) benchService
}

// benchService is a server under test: it registers on a grpc.Server and
// publishes a new root to every open stream.
type benchService interface {
	register(grpc.ServiceRegistrar)
	publish(root *x509.Certificate) error
}

var benchTargets = []benchTarget{
	{name: "baseline-grpc", method: baselineMethod, new: func(testing.TB) benchService { return newBaselineService() }},
	{name: "sds", method: sdsMethod, new: newSDSService},
}

// BenchmarkSDSStreams opens the streams, measures until every one of them
// has ACKed its first ROOTCA (ns/op: how long opening them took, child
// process start included), then reports what the server process holds
// for them, after a GC, over what it held before the server started:
// heap-B/stream (live heap, the goal: at most 3x the baseline's),
// stack-B/stream (goroutine stacks, outside the heap) and
// goroutines/stream. The harness's own per-stream state (the ACK counter,
// under 100 bytes) is in both. benchreport gives ratios of ns/op only;
// divide the two rows' heap-B/stream for the goal.
func BenchmarkSDSStreams(b *testing.B) {
	roots := benchRoots(b, 1)
	for _, n := range []int{10000} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			for _, tg := range benchTargets {
				b.Run(tg.name, func(b *testing.B) {
					var heap, stack, goroutines float64
					warmGoroutines(3 * n)
					b.ResetTimer()
					for range b.N {
						b.StopTimer()
						svc := tg.new(b)
						before := readHeap()
						b.StartTimer()
						h := startHarness(b, svc, n, roots[0])
						c := startClientProcess(b, h.addr, tg.method, n)
						h.wait(b, h.current(), c)
						b.StopTimer()
						after := readHeap()
						heap += float64(after.heap) - float64(before.heap)
						stack += float64(after.stack) - float64(before.stack)
						goroutines += float64(after.goroutines - before.goroutines)
						c.stop(b)
						h.close()
					}
					total := float64(b.N * n)
					b.ReportMetric(heap/total, "heap-B/stream")
					b.ReportMetric(stack/total, "stack-B/stream")
					b.ReportMetric(goroutines/total, "goroutines/stream")
				})
			}
		})
	}
}

// BenchmarkSDSFanout opens the streams once, then each iteration publishes
// a new root (sds: TrustCell.Set; baseline: a new shared response and a
// closed channel) and waits until the server has read every stream's ACK
// of it. ns/op is that time; the goal is at most 2x the
// baseline's. Two roots alternate, so that every publication changes the
// content. One untimed publication and a GC come first, so that no timed
// one pays for collecting what opening 10,000 streams left behind. At
// least five publications per run whatever b.N, and ns/op is their
// median: one stall of the machine must not decide it. The pair runs one
// after the other; on a shared machine read BenchmarkSDSFanoutInterleaved.
func BenchmarkSDSFanout(b *testing.B) {
	benchFanout(b, benchTargets)
}

// benchFanout runs each target's fan-out one after the other: the median
// of at least five publications to 10,000 streams.
func benchFanout(b *testing.B, targets []benchTarget) {
	roots := benchRoots(b, 2)
	for _, n := range []int{10000} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			for _, tg := range targets {
				b.Run(tg.name, func(b *testing.B) {
					f := startFanout(b, tg, n, roots)
					var pushes []float64
					b.ResetTimer()
					for i := range max(b.N, 5) {
						pushes = append(pushes, float64(f.push(b, roots[i%len(roots)])))
					}
					b.StopTimer()
					b.ReportMetric(median(pushes), "ns/op")
					f.stop(b)
				})
			}
		})
	}
}

// BenchmarkSDSFanoutInterleaved is BenchmarkSDSFanout made robust to a
// shared machine: both servers hold their streams at once and each
// iteration publishes to both, alternating which goes first, so that load
// from elsewhere falls on both alike. Each server runs in a child process
// of its own (TestSDSBenchServer, with its clients in a grandchild): in
// one process each server's fan-out would also pay for collecting garbage
// among the other's streams, which pulls the ratio towards 1. x-baseline
// is the median over iterations of the sds fan-out's time over the
// baseline's (goal at most 2); ns/op is the median sds fan-out. At least
// five pairs whatever b.N, so that -benchtime=1x still gives a median.
func BenchmarkSDSFanoutInterleaved(b *testing.B) {
	benchInterleaved(b, benchTargets[0], benchTargets[1])
}

// benchInterleaved runs base and ours in child processes of their own and
// publishes to both in each iteration, alternating which goes first.
func benchInterleaved(b *testing.B, baseTarget, oursTarget benchTarget) {
	for _, n := range []int{10000} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			base := startServerProcess(b, baseTarget, n)
			ours := startServerProcess(b, oursTarget, n)
			var ratios, times []float64
			b.ResetTimer()
			for i := range max(b.N, 5) {
				var db, do time.Duration
				if i%2 == 0 {
					db, do = base.push(b), ours.push(b)
				} else {
					do, db = ours.push(b), base.push(b)
				}
				ratios = append(ratios, float64(do)/float64(db))
				times = append(times, float64(do))
			}
			b.StopTimer()
			b.ReportMetric(median(times), "ns/op")
			b.ReportMetric(median(ratios), "x-baseline")
			ours.stop(b)
			base.stop(b)
		})
	}
}

// BenchmarkSDSFanoutPolicyInterleaved is BenchmarkSDSFanoutPolicy made
// robust to a shared machine the way BenchmarkSDSFanoutInterleaved is:
// x-baseline is the median ratio of the fan-out with the 1,000-rule policy
// to the same server's without one (the goal: at most 1.2).
func BenchmarkSDSFanoutPolicyInterleaved(b *testing.B) {
	benchInterleaved(b, policyTargets[0], policyTargets[1])
}

// BenchmarkSDSFanoutPolicy is the fan-out of BenchmarkSDSFanout with a
// trust policy of 1,000 rules (sub-benchmark "sds-policy") against the
// same server without one ("baseline-sds"), measured in the same run: the
// issue's goal is at most 1.2x. Both subscribe every stream to ALL, where
// the policy acts, and a stream's identity is its connection's
// (spiffe://example.org/ns/n<port%100>/sa/w<port>: 100 identities). The
// policy has 500 prefix rules (/ns/n<i>/*, each granting
// partner.example with its own peer prefix, so that the streams hold 100
// different decisions and ALL is encoded 100 times per publication, not
// once) and 500 exact rules that match no stream. Each publication
// rotates the local root, which changes every stream's ALL.
func BenchmarkSDSFanoutPolicy(b *testing.B) {
	benchFanout(b, policyTargets)
}

var benchPartner = spiffeid.RequireTrustDomainFromString("partner.example")

var policyTargets = []benchTarget{
	{name: "baseline-sds", method: sdsMethod + "?" + sds.AllName, new: func(tb testing.TB) benchService { return newPolicySDSService(tb, false) }},
	{name: "sds-policy", method: sdsMethod + "?" + sds.AllName, new: func(tb testing.TB) benchService { return newPolicySDSService(tb, true) }},
}

// benchPolicy is BenchmarkSDSFanoutPolicy's 1,000 rules.
func benchPolicy(tb testing.TB) *trustpolicy.Policy {
	var rules []trustpolicy.Rule
	for i := range 500 {
		rules = append(rules,
			trustpolicy.Rule{
				Name:         fmt.Sprintf("prefix-%d", i),
				Workloads:    []trustpolicy.Selector{{SPIFFEID: fmt.Sprintf("spiffe://example.org/ns/n%d/*", i)}},
				TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: benchPartner.Name(), Peers: []string{fmt.Sprintf("spiffe://partner.example/ns/p%d/*", i)}}},
			},
			trustpolicy.Rule{
				Name:         fmt.Sprintf("exact-%d", i),
				Workloads:    []trustpolicy.Selector{{SPIFFEID: fmt.Sprintf("spiffe://example.org/ns/x%d/sa/api", i)}},
				TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: benchPartner.Name()}},
			})
	}
	p, err := trustpolicy.Compile(benchTD, trustpolicy.DefaultAllow, rules)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// newPolicySDSService is an sds server whose callers are told apart by
// their connection, with or without benchPolicy.
func newPolicySDSService(tb testing.TB, withPolicy bool) benchService {
	cell := sds.NewTrustCell()
	cfg := sds.Config{
		TrustDomain: benchTD,
		Trust:       cell,
		Authenticator: authn.AuthenticatorFunc(func(_ context.Context, r authn.Request) (authn.Identity, error) {
			_, port, _ := net.SplitHostPort(r.Peer)
			p, _ := strconv.Atoi(port)
			id, err := spiffeid.FromPathf(benchTD, "/ns/n%d/sa/w%d", p%100, p)
			return authn.Identity{ID: id, Method: authn.MethodX509SVID}, err
		}),
		Registerer: prometheus.NewRegistry(),
	}
	if withPolicy {
		cfg.Policy = trustpolicy.NewAccess(trustpolicy.NewCell(benchPolicy(tb)), nil)
	}
	srv, err := sds.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return &policySDSService{sdsService: sdsService{cell: cell, srv: srv}, partner: testca.New(tb, benchPartner.Name()).Cert}
}

type policySDSService struct {
	sdsService
	partner *x509.Certificate
}

func (s *policySDSService) publish(root *x509.Certificate) error {
	return s.cell.Set([]*x509bundle.Bundle{
		x509bundle.FromX509Authorities(benchTD, []*x509.Certificate{root}),
		x509bundle.FromX509Authorities(benchPartner, []*x509.Certificate{s.partner}),
	})
}

// fanout is one server with n streams, every one of them on the latest
// root.
type fanout struct {
	svc benchService
	h   *benchHarness
	c   *benchClients
}

// startFanout opens n streams on a new tg server and makes one untimed
// publication after roots[0], of the last root, then collects garbage.
func startFanout(tb testing.TB, tg benchTarget, n int, roots []*x509.Certificate) *fanout {
	tb.Helper()
	f := &fanout{svc: tg.new(tb)}
	f.h = startHarness(tb, f.svc, n, roots[0])
	f.c = startClientProcess(tb, f.h.addr, tg.method, n)
	f.h.wait(tb, f.h.current(), f.c)
	f.push(tb, roots[len(roots)-1])
	runtime.GC()
	return f
}

// push publishes root, which must differ from the last one, and returns
// how long it took until every stream ACKed it.
func (f *fanout) push(tb testing.TB, root *x509.Certificate) time.Duration {
	start := time.Now()
	r := f.h.nextRound()
	if err := f.svc.publish(root); err != nil {
		tb.Fatal(err)
	}
	f.h.wait(tb, r, f.c)
	return time.Since(start)
}

func (f *fanout) stop(tb testing.TB) {
	f.c.stop(tb)
	f.h.close()
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	mid := len(s) / 2
	if len(s)%2 == 0 {
		return (s[mid-1] + s[mid]) / 2
	}
	return s[mid]
}

// TestSDSStreamHarness keeps the benchmarks' harness from rotting, in a
// second or two: a few hundred streams on each service, two publications,
// every response checked to hold the current root (which also checks that
// the baseline sends the resource bytes sds sends), and the child-process
// server and clients of the interleaved benchmark run once.
func TestSDSStreamHarness(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const streams = 200
	roots := benchRoots(t, 3)
	for _, tg := range benchTargets {
		t.Run(tg.name, func(t *testing.T) {
			var want atomic.Pointer[[]byte]
			setWant := func(root *x509.Certificate) {
				v := rootCAResource(root).GetValue()
				want.Store(&v)
			}
			check := func(resp *discoveryv3.DiscoveryResponse) error {
				res := resp.GetResources()
				if len(res) != 1 || res[0].GetTypeUrl() != secretTypeURL {
					return fmt.Errorf("want one %s, got %v", secretTypeURL, res)
				}
				if got := res[0].GetValue(); !bytes.Equal(got, *want.Load()) {
					return fmt.Errorf("resource is not the ROOTCA Secret of the current root: %d bytes", len(got))
				}
				return nil
			}
			svc := tg.new(t)
			setWant(roots[0])
			h := startHarness(t, svc, streams, roots[0])
			c := startClientsInProcess(t, h.addr, tg.method, streams, check)
			h.wait(t, h.current(), c)
			for _, root := range roots[1:] {
				r := h.nextRound()
				setWant(root)
				require.NoError(t, svc.publish(root))
				h.wait(t, r, c)
			}
			c.stop(t)
			h.close()
			assert.Equal(t, int64(streams), h.current().acks.Load())
		})
	}
	for _, tg := range policyTargets {
		t.Run(tg.name, func(t *testing.T) {
			check := func(resp *discoveryv3.DiscoveryResponse) error {
				res := resp.GetResources()
				if len(res) != 1 {
					return fmt.Errorf("want ALL alone, got %d resources", len(res))
				}
				var sec tlsv3.Secret
				if err := res[0].UnmarshalTo(&sec); err != nil || sec.GetName() != sds.AllName {
					return fmt.Errorf("want ALL, got %q (%v)", sec.GetName(), err)
				}
				if limited := len(sec.GetValidationContext().GetMatchTypedSubjectAltNames()) > 0; limited != (tg.name == "sds-policy") {
					return fmt.Errorf("%s: SAN matchers present: %v", tg.name, limited)
				}
				return nil
			}
			svc := tg.new(t)
			h := startHarness(t, svc, streams, roots[0])
			c := startClientsInProcess(t, h.addr, tg.method, streams, check)
			h.wait(t, h.current(), c)
			r := h.nextRound()
			require.NoError(t, svc.publish(roots[1]))
			h.wait(t, r, c)
			c.stop(t)
			h.close()
		})
	}
	t.Run("sds/child-processes", func(t *testing.T) {
		// Few streams: starting the two processes is most of the time.
		p := startServerProcess(t, benchTargets[1], 20)
		for range 2 {
			assert.Positive(t, p.push(t))
		}
		p.stop(t)
	})
}

// TestSDSBenchClients is not a test: it is the clients of a benchmark,
// run in a child process (see envBenchClients). It runs until its stdin
// is closed.
func TestSDSBenchClients(t *testing.T) {
	spec := os.Getenv(envBenchClients)
	if spec == "" {
		t.Skip("the clients of the SDS benchmarks, run in a child process")
	}
	var (
		addr, method string
		streams      int
	)
	if _, err := fmt.Sscan(spec, &addr, &method, &streams); err != nil {
		t.Fatalf("%s=%q: %v", envBenchClients, spec, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer cancel()
		_, _ = io.Copy(io.Discard, os.Stdin)
	}()
	if err := runClients(ctx, addr, method, streams, nil); err != nil {
		t.Fatal(err)
	}
}

// TestSDSBenchServer is not a test either: it is one server of
// BenchmarkSDSFanoutInterleaved, run in a child process (see
// envBenchServer). It opens its streams, says so, then publishes a new
// root and reports how long until every stream ACKed it for every line
// read from stdin, until stdin is closed.
func TestSDSBenchServer(t *testing.T) {
	spec := os.Getenv(envBenchServer)
	if spec == "" {
		t.Skip("a server of the SDS benchmarks, run in a child process")
	}
	var (
		name    string
		streams int
	)
	if _, err := fmt.Sscan(spec, &name, &streams); err != nil {
		t.Fatalf("%s=%q: %v", envBenchServer, spec, err)
	}
	targets := slices.Concat(benchTargets, policyTargets)
	i := slices.IndexFunc(targets, func(tg benchTarget) bool { return tg.name == name })
	if i < 0 {
		t.Fatalf("%s=%q: no such server", envBenchServer, spec)
	}
	roots := benchRoots(t, 2)
	f := startFanout(t, targets[i], streams, roots)
	fmt.Println(benchReady)
	in := bufio.NewScanner(os.Stdin)
	for n := 0; in.Scan(); n++ {
		fmt.Println(benchPushed, f.push(t, roots[n%len(roots)]).Nanoseconds())
	}
	f.stop(t)
}

// serverProcess is a server of the interleaved benchmark in a child
// process.
type serverProcess struct {
	stdin  io.WriteCloser
	lines  *bufio.Scanner
	other  bytes.Buffer // what it wrote besides the protocol lines
	stderr bytes.Buffer
	cmd    *exec.Cmd
	once   sync.Once
	err    error
}

func startServerProcess(tb testing.TB, tg benchTarget, streams int) *serverProcess {
	p := &serverProcess{}
	p.cmd = exec.Command(os.Args[0], "-test.run=^TestSDSBenchServer$", "-test.count=1", "-test.timeout=0")
	p.cmd.Env = append(os.Environ(), envBenchServer+"="+tg.name+" "+strconv.Itoa(streams))
	p.cmd.Stderr = &p.stderr
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		tb.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	p.lines = bufio.NewScanner(stdout)
	if err := p.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.close() })
	p.expect(tb, benchReady)
	return p
}

// expect returns the rest of the next protocol line starting with prefix,
// failing tb with what the child wrote if it ends first.
func (p *serverProcess) expect(tb testing.TB, prefix string) string {
	for p.lines.Scan() {
		if rest, ok := strings.CutPrefix(p.lines.Text(), prefix); ok {
			return strings.TrimSpace(rest)
		}
		p.other.WriteString(p.lines.Text() + "\n")
	}
	p.close()
	tb.Fatalf("server process ended before %q: %v\n%s%s", prefix, p.err, p.other.Bytes(), p.stderr.Bytes())
	return ""
}

// push asks for a publication and returns the child's measure of it.
func (p *serverProcess) push(tb testing.TB) time.Duration {
	if _, err := io.WriteString(p.stdin, "push\n"); err != nil {
		tb.Fatal(err)
	}
	ns, err := strconv.ParseInt(p.expect(tb, benchPushed), 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ns)
}

// close ends the child: with stdin closed it stops its clients and
// server and exits.
func (p *serverProcess) close() {
	p.once.Do(func() {
		_ = p.stdin.Close()
		for p.lines.Scan() {
			p.other.WriteString(p.lines.Text() + "\n")
		}
		p.err = p.cmd.Wait()
	})
}

func (p *serverProcess) stop(tb testing.TB) {
	p.close()
	if p.err != nil {
		tb.Fatalf("server process: %v\n%s%s", p.err, p.other.Bytes(), p.stderr.Bytes())
	}
}

// benchRoots mints n roots of the benchmark trust domain.
func benchRoots(tb testing.TB, n int) []*x509.Certificate {
	out := make([]*x509.Certificate, n)
	for i := range out {
		out[i] = testca.New(tb, benchTD.Name()).Cert
	}
	return out
}

// rootCAResource is the ROOTCA Secret of root as sds encodes it:
// deterministic bytes, so the baseline sends exactly what sds sends.
func rootCAResource(root *x509.Certificate) *anypb.Any {
	s := &tlsv3.Secret{
		Name: sds.RootCAName,
		Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{
				InlineBytes: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw}),
			}},
		}},
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s)
	if err != nil {
		panic(err) // a Secret built here always marshals
	}
	return &anypb.Any{TypeUrl: secretTypeURL, Value: b}
}

// sdsService is the server under test.
type sdsService struct {
	cell *sds.TrustCell
	srv  *sds.Server
}

func newSDSService(tb testing.TB) benchService {
	id := spiffeid.RequireFromPath(benchTD, "/bench/workload")
	cell := sds.NewTrustCell()
	srv, err := sds.New(sds.Config{
		TrustDomain: benchTD,
		Trust:       cell,
		Authenticator: authn.AuthenticatorFunc(func(context.Context, authn.Request) (authn.Identity, error) {
			return authn.Identity{ID: id, Method: authn.MethodX509SVID}, nil
		}),
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		tb.Fatal(err)
	}
	return &sdsService{cell: cell, srv: srv}
}

func (s *sdsService) register(r grpc.ServiceRegistrar) { s.srv.Register(r) }

func (s *sdsService) publish(root *x509.Certificate) error {
	return s.cell.Set([]*x509bundle.Bundle{x509bundle.FromX509Authorities(benchTD, []*x509.Certificate{root})})
}

// baselineService is a bare grpc-go fan-out of the same messages.
type baselineService struct {
	mu  sync.Mutex
	cur *baselineVersion
	seq int
}

// baselineVersion is one publication: the resources every stream sends,
// shared read-only, and a channel closed by the next publication.
type baselineVersion struct {
	version   string
	resources []*anypb.Any
	changed   chan struct{}
}

func newBaselineService() *baselineService {
	return &baselineService{cur: &baselineVersion{changed: make(chan struct{})}}
}

func (s *baselineService) register(r grpc.ServiceRegistrar) {
	r.RegisterService(&grpc.ServiceDesc{
		ServiceName: "trustbridge.bench.Baseline",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName:    "Stream",
			Handler:       func(_ any, ss grpc.ServerStream) error { return s.stream(ss) },
			ServerStreams: true,
			ClientStreams: true,
		}},
	}, s)
}

func (s *baselineService) publish(root *x509.Certificate) error {
	res := []*anypb.Any{rootCAResource(root)}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	prev := s.cur
	// A version as long as sds's (16 hex digits), so the messages are the
	// same size.
	s.cur = &baselineVersion{version: fmt.Sprintf("%016x", s.seq), resources: res, changed: make(chan struct{})}
	close(prev.changed)
	return nil
}

func (s *baselineService) current() *baselineVersion {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

func (s *baselineService) stream(ss grpc.ServerStream) error {
	if err := ss.RecvMsg(new(discoveryv3.DiscoveryRequest)); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		for {
			if err := ss.RecvMsg(new(discoveryv3.DiscoveryRequest)); err != nil {
				errc <- err
				return
			}
		}
	}()
	v := s.current()
	for {
		resp := &discoveryv3.DiscoveryResponse{VersionInfo: v.version, Resources: v.resources, TypeUrl: secretTypeURL, Nonce: v.version}
		if err := ss.SendMsg(resp); err != nil {
			return err
		}
		select {
		case <-v.changed:
			v = s.current()
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// benchHarness is the gRPC server and the ACK counting.
type benchHarness struct {
	streams int
	addr    string
	srv     *grpc.Server
	served  chan error
	round   atomic.Pointer[benchRound]
	once    sync.Once
}

// benchRound is one publication (or the streams' opening): done is
// closed once the server has read the ACK of it on every stream.
type benchRound struct {
	need int64
	acks atomic.Int64
	done chan struct{}
}

func (r *benchRound) ack() {
	if r.acks.Add(1) == r.need {
		close(r.done)
	}
}

// startHarness publishes first, then serves svc with the ACK counter.
func startHarness(tb testing.TB, svc benchService, streams int, first *x509.Certificate) *benchHarness {
	if err := svc.publish(first); err != nil {
		tb.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	h := &benchHarness{streams: streams, addr: lis.Addr().String(), served: make(chan error, 1)}
	h.round.Store(&benchRound{need: int64(streams), done: make(chan struct{})})
	h.srv = grpc.NewServer(
		grpc.MaxConcurrentStreams(4*benchStreamsPerConn),
		grpc.StreamInterceptor(h.intercept),
		// Stop returns once every handler has: no goroutine outlives
		// the harness.
		grpc.WaitForHandlers(true),
	)
	svc.register(h.srv)
	go func() { h.served <- h.srv.Serve(lis) }()
	tb.Cleanup(h.close)
	return h
}

// close stops the server; the clients should be gone first.
func (h *benchHarness) close() {
	h.once.Do(func() {
		h.srv.Stop()
		<-h.served
	})
}

func (h *benchHarness) current() *benchRound { return h.round.Load() }

// nextRound starts counting ACKs for a publication about to be made.
// Every stream must have ACKed the previous one.
func (h *benchHarness) nextRound() *benchRound {
	r := &benchRound{need: int64(h.streams), done: make(chan struct{})}
	h.round.Store(r)
	return r
}

// wait returns when every stream has ACKed r, failing if the clients end
// first or the round takes longer than benchRoundTimeout.
func (h *benchHarness) wait(tb testing.TB, r *benchRound, c *benchClients) {
	t := time.NewTimer(benchRoundTimeout)
	defer t.Stop()
	select {
	case <-r.done:
	case <-c.exited:
		tb.Fatalf("clients ended with %d of %d streams ACKed: %v", r.acks.Load(), r.need, c.err)
	case <-t.C:
		tb.Fatalf("%d of %d streams ACKed after %v", r.acks.Load(), r.need, benchRoundTimeout)
	}
}

func (h *benchHarness) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &ackCounter{ServerStream: ss, h: h})
}

// ackCounter counts, once per stream and round, the request that ACKs the
// last response the stream sent in that round.
type ackCounter struct {
	grpc.ServerStream
	h *benchHarness

	mu          sync.Mutex // SendMsg and RecvMsg run on different goroutines
	nonce       string
	sent, acked *benchRound
}

func (s *ackCounter) SendMsg(m any) error {
	if resp, ok := m.(*discoveryv3.DiscoveryResponse); ok {
		// Before sending: the ACK may be read before SendMsg returns.
		s.mu.Lock()
		s.nonce, s.sent = resp.GetNonce(), s.h.round.Load()
		s.mu.Unlock()
	}
	return s.ServerStream.SendMsg(m)
}

func (s *ackCounter) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	req, ok := m.(*discoveryv3.DiscoveryRequest)
	if !ok || req.GetErrorDetail() != nil {
		return nil
	}
	var r *benchRound
	s.mu.Lock()
	if s.sent != nil && s.sent != s.acked && req.GetResponseNonce() == s.nonce {
		r, s.acked = s.sent, s.sent
	}
	s.mu.Unlock()
	if r != nil {
		r.ack()
	}
	return nil
}

// benchClients are the streams' clients, in this process or a child.
type benchClients struct {
	exited chan struct{}
	err    error // set before exited is closed
	cancel func()
	once   sync.Once
}

// stop ends the clients and waits for them; an error of theirs fails tb.
func (c *benchClients) stop(tb testing.TB) {
	c.once.Do(c.cancel)
	<-c.exited
	if c.err != nil {
		tb.Fatalf("clients: %v", c.err)
	}
}

func startClientsInProcess(tb testing.TB, addr, method string, streams int, check func(*discoveryv3.DiscoveryResponse) error) *benchClients {
	ctx, cancel := context.WithCancel(context.Background())
	c := &benchClients{exited: make(chan struct{}), cancel: cancel}
	go func() {
		c.err = runClients(ctx, addr, method, streams, check)
		close(c.exited)
	}()
	tb.Cleanup(func() {
		c.once.Do(c.cancel)
		<-c.exited
	})
	return c
}

// startClientProcess runs the clients in this test binary re-run as
// TestSDSBenchClients; closing its stdin ends it.
func startClientProcess(tb testing.TB, addr, method string, streams int) *benchClients {
	cmd := exec.Command(os.Args[0], "-test.run=^TestSDSBenchClients$", "-test.count=1", "-test.timeout=0")
	cmd.Env = append(os.Environ(), envBenchClients+"="+addr+" "+method+" "+strconv.Itoa(streams))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	c := &benchClients{exited: make(chan struct{}), cancel: func() { _ = stdin.Close() }}
	go func() {
		if err := cmd.Wait(); err != nil {
			c.err = fmt.Errorf("client process: %w\n%s", err, out.Bytes())
		}
		close(c.exited)
	}()
	tb.Cleanup(func() {
		c.once.Do(c.cancel)
		<-c.exited
	})
	return c
}

// runClients opens streams to addr over connections of
// benchStreamsPerConn streams each and runs them until ctx ends or one
// fails.
func runClients(ctx context.Context, addr, method string, streams int, check func(*discoveryv3.DiscoveryResponse) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conns := make([]*grpc.ClientConn, (streams+benchStreamsPerConn-1)/benchStreamsPerConn)
	for i := range conns {
		cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer cc.Close()
		conns[i] = cc
	}
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for i := range streams {
		wg.Go(func() {
			err := runStream(ctx, conns[i%len(conns)], method, i, check)
			if err != nil && ctx.Err() == nil {
				once.Do(func() {
					first = fmt.Errorf("stream %d: %w", i, err)
					cancel()
				})
			}
		})
	}
	wg.Wait()
	return first
}

// runStream subscribes to ROOTCA (or the resource named after a "?" in
// method) as Envoy does and ACKs every response.
func runStream(ctx context.Context, cc *grpc.ClientConn, method string, i int, check func(*discoveryv3.DiscoveryResponse) error) error {
	method, name, ok := strings.Cut(method, "?")
	if !ok {
		name = sds.RootCAName
	}
	cs, err := cc.NewStream(ctx, &bidiStream, method)
	if err != nil {
		return err
	}
	names := []string{name}
	req := &discoveryv3.DiscoveryRequest{
		Node:          &corev3.Node{Id: "bench-" + strconv.Itoa(i)},
		ResourceNames: names,
		TypeUrl:       secretTypeURL,
	}
	if err := cs.SendMsg(req); err != nil {
		return err
	}
	for {
		resp := new(discoveryv3.DiscoveryResponse)
		if err := cs.RecvMsg(resp); err != nil {
			return err
		}
		if check != nil {
			if err := check(resp); err != nil {
				return err
			}
		}
		ack := &discoveryv3.DiscoveryRequest{
			VersionInfo:   resp.GetVersionInfo(),
			ResourceNames: names,
			TypeUrl:       secretTypeURL,
			ResponseNonce: resp.GetNonce(),
		}
		if err := cs.SendMsg(ack); err != nil {
			return err
		}
	}
}

// warmGoroutines runs n goroutines at once. The runtime never frees a
// goroutine's descriptor (a few hundred bytes of heap): an exited one
// waits on a free list for reuse. Without this, whichever server ran
// first in the process would be charged for the descriptors of all its
// goroutines and the other for none; with it, neither is, and
// goroutines/stream shows they run the same number.
func warmGoroutines(n int) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Go(func() { <-start })
	}
	close(start)
	wg.Wait()
}

// heapState is what the process holds, after a GC.
type heapState struct {
	heap, stack uint64
	goroutines  int
}

func readHeap() heapState {
	// Twice: objects with finalizers are freed by the second.
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return heapState{heap: m.HeapAlloc, stack: m.StackInuse, goroutines: runtime.NumGoroutine()}
}
