//go:build unix

package agent

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"log/slog"
	mathrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/sds"
	"github.com/trustbridge/trustbridge/sds/attest"
)

// BenchmarkTaintReissue measures issue 38's "taint means re-issue now" on
// a node agent holding 1,000 workload identities: the time from `ca
// authority taint` of the authority that signed all of their X509-SVIDs
// to the last of them re-issued by the CA's next authority, as a ratio to
// 1,000 sequential issuances through the same path in the same run.
//
// The harness is the smallest that keeps every part of that path real: a
// ca.Authority (self-signed, state in a temporary directory) behind the
// real certificate service on 127.0.0.1 (TLS, the node's token,
// ImpersonatedIdentity), its bundle and tainted authorities followed on
// every change the CA signals, as internal/server's followCA and caTaints
// do (taintFollow); and on the agent side the node agent's own parts,
// built by nodeParts: the ImpersonationFetcher, the IdentityCache and,
// beside each identity, its WatchBundles stream (1,000 streams over ten
// connections), whose messages carry the taints to the agent's
// taintCell and so to the cache. The 1,000 identities are held as a
// workload's Workload API or SDS call holds them (nodeAuthenticator's
// acquire); attestation, the identity map and the local sockets, which a
// re-issue does not touch, are left out. The node agent fixture
// (startNodeFixture) attests this process as one workload, so it cannot
// hold 1,000.
//
// Each iteration, untimed, prepares the CA's next authority and
// activates it at once (`activate --now`), and waits until every
// identity's trust stream has delivered the bundle holding it, as an
// operator's prepare and activate would have reached the node long
// before the taint. Then, timed, it taints the authority that signed the
// 1,000 certificates and waits until each identity's credential is a
// certificate whose AuthorityKeyId is the new authority's SubjectKeyId
// (each handle's Changed signal, no polling).
//
//   - baseline:sequential: 1,000 issuances one after the other through the
//     cache's own fetcher (a new P-256 key, CreateCertificate over a new
//     TLS connection as the ImpersonationFetcher makes one per call, the
//     chain checked), for the same 1,000 identities. ns/op is the 1,000.
//   - spread=1s: the server's re-issue spread at 1 s, the least the wire
//     carries (whole seconds; certservice takes 0 as its default of a
//     minute). The cache draws each identity's re-issue uniformly over
//     the spread, at most DefaultMaxConcurrentFetches at a time, so the
//     time is at least the spread: ns/op is taint to last re-issued,
//     median of the iterations; seen-ns the taint's trip from the CA to
//     the agent's taint cell; past-window-ns how long after that plus the
//     spread the last one landed (what the re-issue machinery trails the
//     window by).
//   - at-once (with envBenchLong set, to keep make bench's sds/agent
//     under go test's 10-minute timeout): the same with the cache's
//     jitter drawn as 0 (its Rand), so every re-issue is due as the taint
//     arrives, as a spread of 0 would make it (caclient takes 0 on the
//     wire as at once): the re-issue machinery's own throughput,
//     reissues/s, without the window. It runs on the same fixture after
//     spread=1s, so read it against its own x-sequential.
//
// Both taint rows also run a sequential round in each iteration,
// alternating which goes first, and report x-sequential, the median of
// the taint's time over that round's (seq-ns), and cpu-x-sequential, the
// same of this process's CPU time (agent, server and CA share it), which
// load from elsewhere on the machine moves less. fanout-ns is the
// untimed wait before the taint: the next authority's bundle reaching
// all 1,000 trust streams, as the taint's own message must too.
// Bounded: one fixture per run, 1,000 identities, b.N iterations per row
// (one at make bench's -benchtime 1s, each taking more than a second).
// Unix only: CPU time from getrusage.
func BenchmarkTaintReissue(b *testing.B) {
	if testing.Short() {
		b.Skip("1,000 workloads against a real CA: not under -short")
	}
	f := newTaintBench(b, benchIdentities)
	b.Run("baseline:sequential", func(b *testing.B) {
		var total time.Duration
		for range b.N {
			total += f.sequential(b)
		}
		b.ReportMetric(float64(total.Nanoseconds())/float64(b.N*len(f.ids)), "ns/issue")
	})
	b.Run("spread=1s", func(b *testing.B) { f.taintRounds(b, false) })
	if os.Getenv(envBenchLong) != "" {
		b.Run("at-once", func(b *testing.B) { f.taintRounds(b, true) })
	}
}

// taintBenchSpread is the re-issue spread the server sends: the least
// the wire carries.
const taintBenchSpread = time.Second

type taintBench struct {
	cs      *certService
	ids     []spiffeid.ID
	handles []*IdentityHandle
	cache   *IdentityCache
	trust   *nodeTrust
	seen    *taintSeen
	// atOnce makes the cache draw every taint's jitter as 0.
	atOnce atomic.Bool
}

// newTaintBench starts the CA and certificate service, and the node
// agent's parts holding n identities.
func newTaintBench(b *testing.B, n int) *taintBench {
	b.Helper()
	f := &taintBench{seen: &taintSeen{at: map[string]time.Time{}}}
	for i := range n {
		f.ids = append(f.ids, spiffeid.RequireFromPathf(tdA, "/ns/bench/sa/w%d", i))
	}
	f.cs = newCertServiceWith(b, func(cfg *certservice.Config, authority *ca.Authority) {
		follow := newTaintFollow(authority)
		startServing(b, follow.run)
		cfg.Bundles, cfg.Taints, cfg.ReissueSpread = follow, follow, taintBenchSpread
	}, f.ids...)

	a := f.nodeAgent(b)
	node := a.rot.(interface {
		NodeCredentials() (NodeCredentials, error)
	})
	conns := &nodeConns{dial: func() (*grpc.ClientConn, error) { return nodeConn(a.caAddr, node.NodeCredentials) }}
	auth, err := a.nodeParts(node.NodeCredentials, conns)
	require.NoError(b, err)
	f.cache, f.trust = auth.cache, auth.trust
	// The at-once row's switch, as IdentityCacheConfig.Rand (which
	// nodeParts leaves to its default); set before Run, so nothing reads
	// it yet.
	f.cache.rand = func() float64 {
		if f.atOnce.Load() {
			return 0
		}
		return mathrand.Float64()
	}
	a.taints.follow(f.seen.follow)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.cache.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		require.NoError(b, <-done)
		conns.Close()
	})
	f.handles = f.hold(b, auth)
	return f
}

// nodeAgent is a node agent as startNodeFixture configures one, its
// Rotator holding the node's own certificate, not run.
func (f *taintBench) nodeAgent(b *testing.B) *Agent {
	b.Helper()
	dir := shortDir(b)
	token := filepath.Join(dir, "token")
	writeFile(b, token, []byte(nodeToken+"\n"))
	attestor, err := attest.New(attest.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(b, err)
	a := newTestAgent(b, Config{
		SocketPath: filepath.Join(dir, "node.sock"), CredentialsDir: filepath.Join(dir, "creds"),
		Rotator: &RotatorConfig{CAAddr: f.cs.addr, Roots: f.cs.authority.Bundle().X509Authorities(), ServerID: serverID, TokenFile: token},
		Node:    &NodeConfig{Attestor: attestor, Map: identitymap.NewCell(hostMap(b, webID)), NodeName: "node-a"},
		RootCA:  sds.RootCASPIFFE,
		Logger:  slog.New(slog.DiscardHandler),
	})
	require.NoError(b, a.rot.Init(b.Context()))
	return a
}

// hold acquires every identity as a workload's call would, its trust
// arrived, 32 at a time.
func (f *taintBench) hold(b *testing.B, auth *nodeAuthenticator) []*IdentityHandle {
	b.Helper()
	handles := make([]*IdentityHandle, len(f.ids))
	errs := make([]error, len(f.ids))
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i, id := range f.ids {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), benchRoundTimeout)
			defer cancel()
			handles[i], errs[i] = auth.acquire(ctx, IdentityRequest{ID: id})
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(b, err, "%s", f.ids[i])
	}
	return handles
}

// sequential issues a certificate for each identity in turn, as the
// cache's fetch does, and returns the time it took.
func (f *taintBench) sequential(b *testing.B) time.Duration {
	b.Helper()
	fetcher := f.cache.fetcher.(IdentityRequestFetcher)
	start := time.Now()
	for _, id := range f.ids {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(b, err)
		ctx, cancel := context.WithTimeout(context.Background(), identityCallTimeout)
		chain, err := fetcher.FetchIdentity(ctx, IdentityRequest{ID: id}, key)
		cancel()
		require.NoError(b, err)
		require.NoError(b, checkFetched(chain, key, id, nil, time.Now()))
	}
	return time.Since(start)
}

// taintRound is one iteration's measures of a taint row.
type taintRound struct {
	// taint is from the taint call to the last identity re-issued; seen
	// to the agent's taint cell taking it; seq the sequential round.
	taint, seen, seq time.Duration
	// taintCPU and seqCPU are this process's CPU time (agent, server and
	// CA) in each.
	taintCPU, seqCPU time.Duration
	// fanout is the untimed wait for the next authority's bundle on
	// every identity's trust stream, from the activation.
	fanout time.Duration
}

// taintRounds runs b.N iterations of a taint and a sequential round,
// alternating which goes first, and reports their medians.
func (f *taintBench) taintRounds(b *testing.B, atOnce bool) {
	f.atOnce.Store(atOnce)
	defer f.atOnce.Store(false)
	var rounds []taintRound
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		var r taintRound
		old, next := f.nextAuthority(b, &r)
		b.StartTimer()
		if i%2 == 0 {
			f.taint(b, &r, old, next)
			f.sequentialRound(b, &r)
		} else {
			f.sequentialRound(b, &r)
			f.taint(b, &r, old, next)
		}
		rounds = append(rounds, r)
	}
	b.StopTimer()
	med := func(x func(taintRound) float64) float64 {
		xs := make([]float64, len(rounds))
		for i, r := range rounds {
			xs[i] = x(r)
		}
		return medianOf(xs)
	}
	b.ReportMetric(med(func(r taintRound) float64 { return float64(r.taint) }), "ns/op")
	b.ReportMetric(med(func(r taintRound) float64 { return float64(r.seq) }), "seq-ns")
	b.ReportMetric(med(func(r taintRound) float64 { return float64(r.taint) / float64(r.seq) }), "x-sequential")
	b.ReportMetric(med(func(r taintRound) float64 { return float64(r.taintCPU) / float64(r.seqCPU) }), "cpu-x-sequential")
	b.ReportMetric(med(func(r taintRound) float64 { return float64(r.seen) }), "seen-ns")
	b.ReportMetric(med(func(r taintRound) float64 { return float64(r.fanout) }), "fanout-ns")
	if atOnce {
		b.ReportMetric(med(func(r taintRound) float64 { return float64(len(f.ids)) / (r.taint - r.seen).Seconds() }), "reissues/s")
	} else {
		b.ReportMetric(med(func(r taintRound) float64 { return float64(r.taint - r.seen - taintBenchSpread) }), "past-window-ns")
	}
}

// sequentialRound is sequential, with its CPU time, into r.
func (f *taintBench) sequentialRound(b *testing.B, r *taintRound) {
	cpu := cpuTime()
	r.seq = f.sequential(b)
	r.seqCPU = cpuTime() - cpu
}

// cpuTime is the CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// nextAuthority prepares the CA's next authority and activates it at
// once, and waits until every identity's trust stream has brought the
// bundle holding it (r.fanout). It returns the authority that signed
// until now and the new one.
func (f *taintBench) nextAuthority(b *testing.B, r *taintRound) (old ca.RootInfo, next *x509.Certificate) {
	b.Helper()
	a := f.cs.authority
	old = activeRoot(b, a)
	_, err := a.ChangeAuthority(ca.AuthorityChange{Action: "prepare"})
	require.NoError(b, err)
	_, err = a.ChangeAuthority(ca.AuthorityChange{Action: "activate", Now: true})
	require.NoError(b, err)
	start := time.Now()
	next = activeRoot(b, a).Cert
	timeout := time.After(benchRoundTimeout)
	for _, id := range f.ids {
		f.waitTrust(b, id, next, timeout)
	}
	r.fanout = time.Since(start)
	return old, next
}

func activeRoot(b *testing.B, a *ca.Authority) ca.RootInfo {
	b.Helper()
	for _, r := range a.Roots() {
		if r.State == castate.StateActive {
			return r
		}
	}
	b.Fatal("the CA has no active root")
	return ca.RootInfo{}
}

// waitTrust returns once id's trust holds root, or fails at timeout.
func (f *taintBench) waitTrust(b *testing.B, id spiffeid.ID, root *x509.Certificate, timeout <-chan time.Time) {
	b.Helper()
	for {
		bundles, changed := f.trust.bundlesFor(id)
		if slices.ContainsFunc(bundles, func(x *spiffebundle.Bundle) bool { return x.HasX509Authority(root) }) {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			b.Fatalf("%s's trust stream did not bring the next authority within %s", id, benchRoundTimeout)
		}
	}
}

// taint taints old, which signed every identity's certificate, and
// measures into r how long until each identity held one next signed,
// and when the agent took the taint, both from the taint call.
func (f *taintBench) taint(b *testing.B, r *taintRound, old ca.RootInfo, next *x509.Certificate) {
	b.Helper()
	for _, h := range f.handles {
		require.True(b, signedBy(b, h, old.Cert), "%s: signed by the authority to taint before the taint", h.ID())
	}
	cpu, start := cpuTime(), time.Now()
	_, err := f.cs.authority.ChangeAuthority(ca.AuthorityChange{Action: "taint", ID: old.ID})
	require.NoError(b, err)
	timeout := time.After(benchRoundTimeout)
	for _, h := range f.handles {
		for {
			changed := h.Changed()
			if signedBy(b, h, next) {
				break
			}
			select {
			case <-changed:
			case <-timeout:
				b.Fatalf("%s not re-issued by the next authority within %s", h.ID(), benchRoundTimeout)
			}
		}
	}
	r.taint, r.taintCPU = time.Since(start), cpuTime()-cpu
	seen, ok := f.seen.when(old.Cert.SubjectKeyId)
	require.True(b, ok, "the agent took the taint")
	r.seen = seen.Sub(start)
}

// signedBy tells whether h's credential was signed by root.
func signedBy(b *testing.B, h *IdentityHandle, root *x509.Certificate) bool {
	b.Helper()
	cred, err := h.Credential(context.Background(), h.ID())
	require.NoError(b, err)
	return bytes.Equal(cred.Chain[0].AuthorityKeyId, root.SubjectKeyId)
}

// taintSeen records when the agent's taint cell first held each tainted
// authority: a taintFollower.
type taintSeen struct {
	mu sync.Mutex
	at map[string]time.Time // by SubjectKeyId
}

func (s *taintSeen) follow(set taintSet) int {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range set.authorities {
		if _, ok := s.at[string(t.X509SubjectKeyID)]; !ok && len(t.X509SubjectKeyID) > 0 {
			s.at[string(t.X509SubjectKeyID)] = now
		}
	}
	return 0
}

func (s *taintSeen) when(skid []byte) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.at[string(skid)]
	return at, ok
}

// taintFollow is the CA's bundle and tainted X.509 authorities as the
// server hands them to the certificate service (internal/server's
// followCA and caTaints): read again on every change the CA signals,
// each reader's channel closed when what it reads changed.
type taintFollow struct {
	a       *ca.Authority
	changes <-chan struct{}

	mu            sync.Mutex
	bundle        *spiffebundle.Bundle
	taints        []certservice.Tainted
	bundleChanged chan struct{}
	taintsChanged chan struct{}
}

// newTaintFollow reads a's state now; run follows it.
func newTaintFollow(a *ca.Authority) *taintFollow {
	f := &taintFollow{a: a, changes: a.Subscribe(), bundleChanged: make(chan struct{}), taintsChanged: make(chan struct{})}
	f.update()
	return f
}

func (f *taintFollow) run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-f.changes:
			f.update()
		}
	}
}

// update is caTaints.update for X.509 authorities, and the bundle.
func (f *taintFollow) update() {
	var taints []certservice.Tainted
	for _, r := range f.a.Roots() {
		if !r.TaintedAt.IsZero() && r.State != castate.StateRevoked {
			taints = append(taints, certservice.Tainted{X509SubjectKeyID: r.Cert.SubjectKeyId, X509SHA256: r.CertSHA256, At: r.TaintedAt})
		}
	}
	bundle := f.a.Bundle()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.bundle == nil || !f.bundle.Equal(bundle) {
		f.bundle = bundle
		close(f.bundleChanged)
		f.bundleChanged = make(chan struct{})
	}
	if !slices.EqualFunc(f.taints, taints, func(x, y certservice.Tainted) bool {
		return bytes.Equal(x.X509SubjectKeyID, y.X509SubjectKeyID) && x.At.Equal(y.At)
	}) {
		f.taints = taints
		close(f.taintsChanged)
		f.taintsChanged = make(chan struct{})
	}
}

// Bundles implements certservice.BundleSource.
func (f *taintFollow) Bundles() ([]*spiffebundle.Bundle, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return []*spiffebundle.Bundle{f.bundle}, f.bundleChanged
}

// Tainted implements certservice.TaintSource.
func (f *taintFollow) Tainted() ([]certservice.Tainted, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.taints, f.taintsChanged
}
