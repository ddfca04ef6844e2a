package agent

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
	"github.com/trustbridge/trustbridge/sds"
)

// BenchmarkNodeFanout measures a root rotation's fan-out on a node agent
// holding 1,000 identities (issue 34), against the single-identity
// agent's fan-out to the same number of streams, in the same run:
//
//   - baseline:one-identity: the local SDS server as the single-identity
//     agent composes it (newSDSServer): one TrustCell, one credential, the
//     relayed policy, every stream the same identity. The rotation is what
//     the relay does on the server's new bundles: TrustCell.Set.
//   - identities=1000: the local SDS server as runNode composes it
//     (nodeTrust as Trust and Policy, the IdentityCache's credentials,
//     nodeAuthenticator holding each stream's identity), the streams
//     spread evenly over 1,000 identities. The rotation is what the
//     server sends: the new root on each identity's trust stream, 1,000
//     messages, each taken by its follow goroutine (nodeTrust.update).
//
// Both serve ROOTCA as the SPIFFE validator (node mode's default) on a
// real unix socket, with the clients in this process on fanoutConns
// connections, one per workload's Envoy (connection c is workload
// c%identities), the streams spread evenly over them. Each stream sends
// its workload's token (a stand-in for attestation, which
// BenchmarkAttestConnection measures), subscribes to ROOTCA and ACKs
// every response as Envoy does. The time is from the change until every
// stream has received a ROOTCA holding the new root, the median of at
// least five rotations; two roots alternate.
// Not included in identities=1000: the 1,000 messages' trip from the
// certificate service over gRPC (a fake trustWatchFunc hands them to
// follow), and certificates come from a local test CA.
//
// identities=1000 runs both servers at once and rotates both in each
// iteration, alternating which goes first, so that load from elsewhere
// falls on both alike: x-one-identity is the median of its time over the
// single-identity agent's in the same iteration; ns/op is its own median.
// The baseline row is the single-identity agent run alone. As in
// BenchmarkSDSFanout, B/op and allocs/op are per run of at least five
// rotations (two servers' in identities=1000), set-up excluded. 10,000
// streams too with envBenchLong set (about 80s a run).
func BenchmarkNodeFanout(b *testing.B) {
	local := testca.New(b, tdA.Name())
	roots := []*x509.Certificate{local.Cert, testca.New(b, tdA.Name()).Cert}
	streams := []int{2000}
	if os.Getenv(envBenchLong) != "" {
		streams = append(streams, 10000)
	}
	for _, n := range streams {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			b.Run("baseline:one-identity", func(b *testing.B) {
				single := startFanoutTarget(b, newSingleFanout(b, local, roots[0]), n, 1, roots)
				var times []float64
				b.ResetTimer()
				for i := range max(b.N, 5) {
					times = append(times, float64(single.rotate(b, roots[i%2])))
				}
				b.ReportMetric(medianOf(times), "ns/op")
			})
			b.Run(fmt.Sprintf("identities=%d", benchIdentities), func(b *testing.B) {
				single := startFanoutTarget(b, newSingleFanout(b, local, roots[0]), n, 1, roots)
				node := startFanoutTarget(b, newNodeFanout(b, local, roots[0]), n, benchIdentities, roots)
				var times, ratios []float64
				b.ResetTimer()
				for i := range max(b.N, 5) {
					root := roots[i%2]
					var dn, ds time.Duration
					if i%2 == 0 {
						dn, ds = node.rotate(b, root), single.rotate(b, root)
					} else {
						ds, dn = single.rotate(b, root), node.rotate(b, root)
					}
					times = append(times, float64(dn))
					ratios = append(ratios, float64(dn)/float64(ds))
				}
				b.ReportMetric(medianOf(times), "ns/op")
				b.ReportMetric(medianOf(ratios), "x-one-identity")
			})
		})
	}
}

// envBenchLong, when set, adds the node agent benchmarks' long variants
// (BenchmarkNodeFanout at 10,000 streams, BenchmarkFirstSVID with SPIRE's
// default sync interval), which would take the package past go test's
// default 10-minute timeout under make bench.
const envBenchLong = "TRUSTBRIDGE_BENCH_LONG"

// fanoutConns is how many client connections carry the streams: one per
// workload of a node agent with benchIdentities identities, the same for
// the single-identity agent so that only the identities differ.
const fanoutConns = benchIdentities

// fanoutServer is an agent's local SDS server under test.
type fanoutServer struct {
	srv *sds.Server
	// rotate publishes root as the new local root.
	rotate func(root *x509.Certificate)
	// run, when set, runs beside the server (the identity cache).
	run func(ctx context.Context) error
}

// newSingleFanout is the single-identity agent's server, composed as
// newSDSServer composes it.
func newSingleFanout(b *testing.B, ca *testca.CA, root *x509.Certificate) fanoutServer {
	b.Helper()
	trust := sds.NewTrustCell()
	set := func(root *x509.Certificate) {
		require.NoError(b, trust.Set([]*x509bundle.Bundle{x509bundle.FromX509Authorities(tdA, []*x509.Certificate{root})}))
	}
	set(root)
	creds := sds.NewCredentialCell(workload)
	leaf, key := ca.Issue(b, workload)
	require.NoError(b, creds.Set([]*x509.Certificate{leaf}, key))
	initial, err := relayedPolicy(tdA, workload, "bench", nil)
	require.NoError(b, err)
	self := authn.AuthenticatorFunc(func(context.Context, authn.Request) (authn.Identity, error) {
		return authn.Identity{ID: workload, Method: localMethod}, nil
	})
	srv, err := sds.New(sds.Config{
		TrustDomain: tdA, RootCA: sds.RootCASPIFFE, Trust: trust, Credentials: creds,
		Authenticator: self, Policy: trustpolicy.NewAccess(trustpolicy.NewCell(initial), nil), Registerer: prometheus.NewRegistry(),
	})
	require.NoError(b, err)
	return fanoutServer{srv: srv, rotate: set}
}

// newNodeFanout is the node agent's server, composed as runNode composes
// it, with identities fetched from ca and trust from a trustFeed.
func newNodeFanout(b *testing.B, ca *testca.CA, root *x509.Certificate) fanoutServer {
	b.Helper()
	feed := newTrustFeed(root)
	m, err := newMetrics(prometheus.NewRegistry())
	require.NoError(b, err)
	log := slog.New(slog.DiscardHandler)
	nt, err := newNodeTrust(tdA, feed.watch, nil, clock.RealClock{}, log, m)
	require.NoError(b, err)
	fetcher := IdentityFetcherFunc(func(_ context.Context, id spiffeid.ID, key crypto.Signer) ([]*x509.Certificate, error) {
		return []*x509.Certificate{issueFor(b, ca, id, key.Public(), time.Now().Add(-time.Minute), 24*time.Hour)}, nil
	})
	cache, err := NewIdentityCache(IdentityCacheConfig{
		Fetcher: fetcher, MaxIdentities: benchIdentities, Logger: log, Registerer: prometheus.NewRegistry(), Companion: nt.follow,
	})
	require.NoError(b, err)
	auth := &nodeAuthenticator{attested: tokenIdentities{}, cache: cache, trust: nt}
	srv, err := sds.New(sds.Config{
		TrustDomain: tdA, RootCA: sds.RootCASPIFFE, Trust: nt, Credentials: cache.CredentialSource(),
		Authenticator: auth, Policy: nt, ReauthInterval: nodeReattestInterval, Logger: log, Registerer: prometheus.NewRegistry(),
	})
	require.NoError(b, err)
	return fanoutServer{srv: srv, rotate: feed.set, run: cache.Run}
}

// tokenIdentities stands in for attestation: the bearer token "w<i>" is
// workload i.
type tokenIdentities struct{}

func (tokenIdentities) Authenticate(_ context.Context, r authn.Request) (authn.Identity, error) {
	id, err := spiffeid.FromPathf(tdA, "/ns/bench/sa/%s", r.BearerToken)
	return authn.Identity{ID: id, Method: localMethod}, err
}

// trustFeed stands in for the certificate service's WatchBundles of every
// workload: each watch gets the current local root, then every new one.
type trustFeed struct {
	mu      sync.Mutex
	bundles []*spiffebundle.Bundle
	changed chan struct{}
}

func newTrustFeed(root *x509.Certificate) *trustFeed {
	f := &trustFeed{changed: make(chan struct{})}
	f.bundles = []*spiffebundle.Bundle{spiffebundle.FromX509Authorities(tdA, []*x509.Certificate{root})}
	return f
}

func (f *trustFeed) set(root *x509.Certificate) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bundles = []*spiffebundle.Bundle{spiffebundle.FromX509Authorities(tdA, []*x509.Certificate{root})}
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *trustFeed) watch(ctx context.Context, _ spiffeid.ID, fn func(workloadTrust, error) error) error {
	for {
		f.mu.Lock()
		bundles, changed := f.bundles, f.changed
		f.mu.Unlock()
		if err := fn(workloadTrust{Bundles: bundles}, nil); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// fanoutTarget is a running server with its client streams.
type fanoutTarget struct {
	rotateFn func(*x509.Certificate)
	// round is the rotation the streams are waiting for.
	round atomic.Pointer[fanoutRound]
	// last is the root last published.
	last *x509.Certificate
	// streams is how many streams each round waits for.
	streams int
}

// fanoutRound is one rotation: done is closed once every stream has
// received a ROOTCA holding marker.
type fanoutRound struct {
	marker  []byte
	pending atomic.Int64
	done    chan struct{}
}

// startFanoutTarget serves s on a unix socket and opens n streams spread
// over ids identities, then rotates once to the other root, untimed.
func startFanoutTarget(b *testing.B, s fanoutServer, n, ids int, roots []*x509.Certificate) *fanoutTarget {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	b.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	if s.run != nil {
		wg.Go(func() { _ = s.run(ctx) })
	}
	lis, err := net.Listen("unix", filepath.Join(b.TempDir(), "sds.sock"))
	require.NoError(b, err)
	gs := newLocalGRPCServer()
	s.srv.Register(gs)
	wg.Go(func() { _ = gs.Serve(lis) })
	b.Cleanup(gs.Stop) // before cancel and wait: cleanups run last first

	t := &fanoutTarget{rotateFn: s.rotate, last: roots[0], streams: n}
	first := t.newRound(roots[0])
	for c := range fanoutConns {
		conn, err := grpc.NewClient("unix://"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(b, err)
		b.Cleanup(func() { _ = conn.Close() })
		client := secretv3.NewSecretDiscoveryServiceClient(conn)
		for i := c; i < n; i += fanoutConns {
			sctx := metadata.AppendToOutgoingContext(ctx, "authorization", fmt.Sprintf("Bearer w%d", c%ids))
			stream, err := client.StreamSecrets(sctx)
			require.NoError(b, err)
			require.NoError(b, stream.Send(&discoveryv3.DiscoveryRequest{
				Node: &corev3.Node{Id: fmt.Sprintf("envoy-%d", i)}, ResourceNames: []string{sds.RootCAName}, TypeUrl: resourcev3.SecretType,
			}))
			wg.Go(func() { t.receive(stream) })
		}
	}
	t.wait(b, first)
	t.rotate(b, roots[1])
	return t
}

func (t *fanoutTarget) newRound(root *x509.Certificate) *fanoutRound {
	r := &fanoutRound{marker: pemCerts(root), done: make(chan struct{})}
	r.pending.Store(int64(t.streams))
	t.round.Store(r)
	return r
}

// receive counts each response holding the current round's root once,
// and ACKs every response.
func (t *fanoutTarget) receive(stream grpc.BidiStreamingClient[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]) {
	var seen *fanoutRound
	for {
		resp, err := stream.Recv()
		if err != nil {
			return
		}
		if r := t.round.Load(); r != seen && holds(resp, r.marker) {
			seen = r
			if r.pending.Add(-1) == 0 {
				close(r.done)
			}
		}
		if err := stream.Send(&discoveryv3.DiscoveryRequest{
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce(),
			ResourceNames: []string{sds.RootCAName}, TypeUrl: resourcev3.SecretType,
		}); err != nil {
			return
		}
	}
}

func holds(resp *discoveryv3.DiscoveryResponse, marker []byte) bool {
	for _, a := range resp.GetResources() {
		if bytes.Contains(a.GetValue(), marker) {
			return true
		}
	}
	return false
}

// rotate publishes root, which must differ from the last one, and returns
// how long until every stream received it.
func (t *fanoutTarget) rotate(b *testing.B, root *x509.Certificate) time.Duration {
	b.Helper()
	if root.Equal(t.last) {
		b.Fatal("rotation to the root already published")
	}
	t.last = root
	r := t.newRound(root)
	start := time.Now()
	t.rotateFn(root)
	t.wait(b, r)
	return time.Since(start)
}

func (t *fanoutTarget) wait(b *testing.B, r *fanoutRound) {
	b.Helper()
	select {
	case <-r.done:
	case <-time.After(benchRoundTimeout):
		b.Fatalf("fan-out: %d streams still without the new root after %s", r.pending.Load(), benchRoundTimeout)
	}
}

// benchRoundTimeout bounds one round so that a broken server fails the
// benchmark instead of hanging it.
const benchRoundTimeout = 2 * time.Minute

func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	mid := len(s) / 2
	if len(s)%2 == 0 {
		return (s[mid-1] + s[mid]) / 2
	}
	return s[mid]
}
