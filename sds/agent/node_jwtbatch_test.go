package agent

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// mintCalls records the unary calls a certificate service was asked,
// by full method name, and for each MintJWTSVIDs call how many tokens it
// asked for; every mint call (MintJWTSVID or MintJWTSVIDs) is told on
// arrived as it arrives, before its handler runs.
type mintCalls struct {
	arrived chan struct{}

	mu      sync.Mutex
	methods []string
	batches []int // items of each MintJWTSVIDs call, in arrival order
}

func newMintCalls() *mintCalls { return &mintCalls{arrived: make(chan struct{}, 64)} }

func (m *mintCalls) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	m.mu.Lock()
	m.methods = append(m.methods, info.FullMethod)
	batch, isBatch := req.(*identityapi.MintJWTSVIDsRequest)
	if isBatch {
		m.batches = append(m.batches, len(batch.GetRequests()))
	}
	m.mu.Unlock()
	if isBatch || info.FullMethod == identityapi.IdentityService_MintJWTSVID_FullMethodName {
		m.arrived <- struct{}{}
	}
	return handler(ctx, req)
}

// count is how many calls of method arrived.
func (m *mintCalls) count(method string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, got := range m.methods {
		if got == method {
			n++
		}
	}
	return n
}

func (m *mintCalls) batchSizes() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]int(nil), m.batches...)
}

// mintFrame starts the stack frame of caclient.JWTBatcher.Mint.
const mintFrame = "github.com/trustbridge/trustbridge/internal/caclient.(*JWTBatcher).Mint("

// mintsWaiting is how many goroutines are parked in JWTBatcher.Mint's
// wait for their token: a mint whose call is on the wire, or one queued
// for the next call (it joins the queue before it waits). Nothing else
// outside caclient tells that a mint is queued, and its tests' waitQueued
// reads the queue the same way, by polling; no test of this package runs
// in parallel with another, so every such goroutine is this test's.
func mintsWaiting() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	waiting := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		header, frames, _ := strings.Cut(g, "\n")
		if !strings.Contains(header, "[select") {
			continue
		}
		// The first frame that is not the runtime's (GOTRACEBACK=system
		// shows gopark and selectgo), then its file:line, and so on.
		for i, line := range strings.Split(frames, "\n") {
			if i%2 == 1 || strings.HasPrefix(line, "runtime.") {
				continue
			}
			if strings.HasPrefix(line, mintFrame) {
				waiting++
			}
			break
		}
	}
	return waiting
}

// waitMintsWaiting waits until n goroutines wait in JWTBatcher.Mint, or
// fails the test when ctx ends first.
func waitMintsWaiting(ctx context.Context, t *testing.T, n int) {
	t.Helper()
	for mintsWaiting() < n {
		if ctx.Err() != nil {
			t.Fatalf("%d mints never all waited in caclient's JWTBatcher.Mint (%d do): %v", n, mintsWaiting(), ctx.Err())
		}
		runtime.Gosched()
	}
}

// A node agent's workloads asking for JWT-SVIDs at once get them in
// MintJWTSVIDs batches from the real certificate service, never by unary
// MintJWTSVID: the server's signer is held while the first two mints are
// on the wire (JWTBatcher's two calls in flight) and the other eight
// wait in the agent; released, those eight go out as one call. Each
// workload gets a token of its identity for its own audience. (Every
// workload here is this process, which the identity map gives webID.)
func TestNodeModeWorkloadAPIBatchesJWTSVIDs(t *testing.T) {
	const workloads = 10
	calls := newMintCalls()
	release := make(chan struct{})
	var releaseOnce sync.Once
	releaseSigner := func() { releaseOnce.Do(func() { close(release) }) }
	f := startNodeFixtureServing(t, []grpc.ServerOption{grpc.ChainUnaryInterceptor(calls.intercept)},
		func(cfg *certservice.Config, authority *ca.Authority) {
			cfg.JWT = certservice.JWTSignerFunc(func(id spiffeid.ID, audience []string, ttl time.Duration) (string, time.Time, error) {
				<-release
				return authority.SignJWT(id, audience, ttl)
			})
			// Both held calls sign at once, rather than the second
			// waiting (and timing out) in the signing queue.
			cfg.Concurrency = 2
		}, nil, webID, webID)
	// Before the server's cleanup, which waits for the calls in progress.
	t.Cleanup(releaseSigner)
	waitSocket(t, f.wl, f.done)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	clients := make([]*workloadapi.Client, workloads)
	for i := range clients {
		c, err := workloadapi.New(ctx, workloadapi.WithAddr(endpointSocket(f.wl)))
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		clients[i] = c
	}
	type result struct {
		svid *jwtsvid.SVID
		err  error
	}
	results := make([]chan result, workloads)
	for i, c := range clients {
		results[i] = make(chan result, 1)
		go func() {
			svid, err := c.FetchJWTSVID(ctx, jwtsvid.Params{Audience: fmt.Sprint("aud-", i)})
			results[i] <- result{svid, err}
		}()
	}
	for range 2 {
		select {
		case <-calls.arrived:
		case <-ctx.Done():
			t.Fatalf("the first two mints never reached the server: %v", ctx.Err())
		}
	}
	waitMintsWaiting(ctx, t, workloads)
	assert.Equal(t, []int{1, 1}, calls.batchSizes(), "two calls on the wire, a mint each; the other mints wait for one")
	releaseSigner()

	bundles, err := clients[0].FetchJWTBundles(ctx)
	require.NoError(t, err)
	for i, ch := range results {
		aud := fmt.Sprint("aud-", i)
		var r result
		select {
		case r = <-ch:
		case <-ctx.Done():
			t.Fatalf("workload %d got no JWT-SVID: %v", i, ctx.Err())
		}
		require.NoError(t, r.err, aud)
		assert.Equal(t, webID, r.svid.ID, aud)
		assert.Equal(t, []string{aud}, r.svid.Audience)
		_, err := jwtsvid.ParseAndValidate(r.svid.Marshal(), bundles, []string{aud})
		assert.NoError(t, err, aud)
	}
	assert.Equal(t, []int{1, 1, workloads - 2}, calls.batchSizes(), "the mints that waited went out in one call")
	assert.Equal(t, 3, calls.count(identityapi.IdentityService_MintJWTSVIDs_FullMethodName))
	assert.Zero(t, calls.count(identityapi.IdentityService_MintJWTSVID_FullMethodName), "no mint fell back to a call of its own")
}
