package caclient

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// agentID is whom the fake identity service mints for when a request
// names no workload: the caller, a node agent.
const agentID = "spiffe://a.example/ns/kube-system/sa/agent"

// The identity service's bounds (identityapi's, which ca/certservice
// enforces): it refuses as a whole a MintJWTSVIDs request larger than
// MaxMintBatchBytes or holding an item larger than MaxMintRequestBytes,
// and refuses such a MintJWTSVID request.
const (
	serverMaxBatchBytes   = identityapi.MaxMintBatchBytes
	serverMaxRequestBytes = identityapi.MaxMintRequestBytes
)

// batchIdentity is an identity service that records every MintJWTSVIDs
// and MintJWTSVID call. The k-th of its first len(gates) MintJWTSVIDs
// calls sends on arrived, then waits until gates[k] is closed, so a test
// decides when each call on the wire is answered. It refuses what the
// server refuses for its size. answer, when set,
// answers MintJWTSVIDs (default: every item minted by mintOne);
// unimplemented makes it answer Unimplemented, as a server that predates
// it.
type batchIdentity struct {
	identityapi.UnimplementedIdentityServiceServer
	gates         []chan struct{}
	arrived       chan struct{}
	answer        func([]*identityapi.MintJWTSVIDRequest) (*identityapi.MintJWTSVIDsResponse, error)
	unimplemented atomic.Bool

	mu      sync.Mutex
	batches [][]*identityapi.MintJWTSVIDRequest
	unary   []*identityapi.MintJWTSVIDRequest
}

// newBatchIdentity holds the first held MintJWTSVIDs calls.
func newBatchIdentity(held int) *batchIdentity {
	f := &batchIdentity{arrived: make(chan struct{}, held)}
	for range held {
		f.gates = append(f.gates, make(chan struct{}))
	}
	return f
}

func (f *batchIdentity) MintJWTSVIDs(ctx context.Context, req *identityapi.MintJWTSVIDsRequest) (*identityapi.MintJWTSVIDsResponse, error) {
	f.mu.Lock()
	k := len(f.batches)
	f.batches = append(f.batches, req.GetRequests())
	f.mu.Unlock()
	if k < len(f.gates) {
		f.arrived <- struct{}{}
		select {
		case <-f.gates[k]:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	switch {
	case f.unimplemented.Load():
		return nil, status.Error(codes.Unimplemented, "unknown method MintJWTSVIDs")
	case proto.Size(req) > serverMaxBatchBytes:
		return nil, status.Error(codes.ResourceExhausted, "batch too large")
	}
	for i, item := range req.GetRequests() {
		if proto.Size(item) > serverMaxRequestBytes {
			return nil, status.Errorf(codes.ResourceExhausted, "item %d: request too large", i)
		}
	}
	if f.answer != nil {
		return f.answer(req.GetRequests())
	}
	return mintAll(req.GetRequests()), nil
}

func (f *batchIdentity) MintJWTSVID(_ context.Context, req *identityapi.MintJWTSVIDRequest) (*identityapi.MintJWTSVIDResponse, error) {
	f.mu.Lock()
	f.unary = append(f.unary, req)
	f.mu.Unlock()
	if proto.Size(req) > serverMaxRequestBytes {
		return nil, status.Error(codes.ResourceExhausted, "request too large")
	}
	return mintOne(req), nil
}

// release answers every held call.
func (f *batchIdentity) release() {
	for _, g := range f.gates {
		close(g)
	}
}

// batchSizes are the sizes of the MintJWTSVIDs calls so far, sorted.
func (f *batchIdentity) batchSizes() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var n []int
	for _, b := range f.batches {
		n = append(n, len(b))
	}
	slices.Sort(n)
	return n
}

// batchAudiences are the audiences of each item of each MintJWTSVIDs
// call so far, in the order the calls arrived.
func (f *batchIdentity) batchAudiences() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out [][]string
	for _, b := range f.batches {
		var auds []string
		for _, r := range b {
			auds = append(auds, strings.Join(r.GetAudience(), ","))
		}
		out = append(out, auds)
	}
	return out
}

func (f *batchIdentity) unaryCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.unary)
}

// batch is the i-th MintJWTSVIDs call's requests.
func (f *batchIdentity) batch(i int) []*identityapi.MintJWTSVIDRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.batches[i]
}

// unaryReq is the i-th MintJWTSVID call's request.
func (f *batchIdentity) unaryReq(i int) *identityapi.MintJWTSVIDRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.unary[i]
}

// mintOne is the token the fake mints for req: its subject and
// audiences in clear, so that a caller can tell its own token.
func mintOne(req *identityapi.MintJWTSVIDRequest) *identityapi.MintJWTSVIDResponse {
	sub := req.GetImpersonatedIdentity()
	if sub == "" {
		sub = agentID
	}
	return &identityapi.MintJWTSVIDResponse{Token: tokenFor(sub, req.GetAudience()...), SpiffeId: sub, ExpiresAt: 1_800_000_000}
}

func mintAll(reqs []*identityapi.MintJWTSVIDRequest) *identityapi.MintJWTSVIDsResponse {
	resp := &identityapi.MintJWTSVIDsResponse{}
	for _, r := range reqs {
		resp.Results = append(resp.Results, &identityapi.MintJWTSVIDResult{Svid: mintOne(r)})
	}
	return resp
}

func tokenFor(sub string, audience ...string) string {
	return "tok|" + sub + "|" + strings.Join(audience, ",")
}

// mintResult is what one Mint returned.
type mintResult struct {
	svid *JWTSVID
	err  error
}

// startMint runs b.Mint for workload (zero: the caller's own) and the
// one audience aud on a goroutine of its own.
func startMint(ctx context.Context, b *JWTBatcher, workload spiffeid.ID, aud string) <-chan mintResult {
	ch := make(chan mintResult, 1)
	go func() {
		svid, err := b.Mint(ctx, workload, []string{aud}, 0)
		ch <- mintResult{svid, err}
	}()
	return ch
}

// queued is how many mints wait for a call.
func queued(b *JWTBatcher) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// waitQueued waits until n mints wait for a call: they were asked for
// while two calls were on the wire.
func waitQueued(b *JWTBatcher, n int) {
	for queued(b) < n {
		runtime.Gosched()
	}
}

// holdTwo puts two mints of the caller's own (audiences held-0 and
// held-1) on the wire, held by f (which holds at least two calls), and
// returns their results.
func holdTwo(t *testing.T, b *JWTBatcher, f *batchIdentity) [2]<-chan mintResult {
	t.Helper()
	var held [2]<-chan mintResult
	for i := range held {
		held[i] = startMint(t.Context(), b, spiffeid.ID{}, fmt.Sprint("held-", i))
		<-f.arrived
	}
	require.Zero(t, queued(b), "a mint alone is sent at once")
	return held
}

// assertOwnToken checks that r is the token of sub for aud.
func assertOwnToken(t *testing.T, r mintResult, sub, aud string) {
	t.Helper()
	if assert.NoError(t, r.err, aud) {
		assert.Equal(t, tokenFor(sub, aud), r.svid.Token, aud)
		assert.Equal(t, sub, r.svid.ID.String(), aud)
	}
}

// coalesce holds two calls on the wire, asks for a mint of the caller's
// own for each of auds, waits until they are all queued, releases the
// held calls and returns the results of auds' mints, having checked that
// the held ones got their tokens.
func coalesce(t *testing.T, b *JWTBatcher, f *batchIdentity, auds []string) []mintResult {
	t.Helper()
	held := holdTwo(t, b, f)
	chans := make([]<-chan mintResult, len(auds))
	for i, aud := range auds {
		chans[i] = startMint(t.Context(), b, spiffeid.ID{}, aud)
	}
	waitQueued(b, len(auds))
	f.release()
	for i, ch := range held {
		assertOwnToken(t, <-ch, agentID, fmt.Sprint("held-", i))
	}
	out := make([]mintResult, len(auds))
	for i, ch := range chans {
		out[i] = <-ch
	}
	return out
}

func audiences(n int) []string {
	auds := make([]string, n)
	for i := range auds {
		auds[i] = fmt.Sprint("aud-", i)
	}
	return auds
}

// A mint alone goes out at once as a batch of one, carrying the request
// MintJWTSVIDFor would send.
func TestJWTBatcherMintAlone(t *testing.T) {
	f := newBatchIdentity(0)
	b := NewJWTBatcher(serveIdentity(t, f))
	web := spiffeid.RequireFromString("spiffe://a.example/ns/shop/sa/web")
	svid, err := b.Mint(t.Context(), web, []string{"db", "cache"}, 1500*time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, &JWTSVID{Token: tokenFor(web.String(), "db", "cache"), ID: web, ExpiresAt: time.Unix(1_800_000_000, 0).UTC()}, svid)

	svid, err = b.Mint(t.Context(), spiffeid.ID{}, []string{"db"}, 0)
	require.NoError(t, err)
	assert.Equal(t, agentID, svid.ID.String())

	require.Equal(t, []int{1, 1}, f.batchSizes())
	first := f.batch(0)[0]
	assert.Equal(t, []string{"db", "cache"}, first.GetAudience())
	assert.Equal(t, int64(2), first.GetTtlSeconds(), "ttl rounded up to whole seconds")
	assert.Equal(t, web.String(), first.GetImpersonatedIdentity())
	assert.Empty(t, f.batch(1)[0].GetImpersonatedIdentity(), "the caller's own asks for nobody else")
	assert.Zero(t, f.unaryCalls())
}

// While two calls are on the wire, what is asked waits and goes out as
// one call once one of them is answered; each caller gets its own token.
func TestJWTBatcherCoalesces(t *testing.T) {
	f := newBatchIdentity(2)
	b := NewJWTBatcher(serveIdentity(t, f))
	auds := audiences(10)
	for i, r := range coalesce(t, b, f, auds) {
		assertOwnToken(t, r, agentID, auds[i])
	}
	assert.Equal(t, []int{1, 1, 10}, f.batchSizes())
	assert.ElementsMatch(t, auds, f.batchAudiences()[2])
	assert.Zero(t, queued(b))
	assert.Zero(t, f.unaryCalls())
}

// More mints than a call may carry go out as several calls of at most
// 64, each mint in exactly one of them.
func TestJWTBatcherSplitsAt64(t *testing.T) {
	f := newBatchIdentity(2)
	b := NewJWTBatcher(serveIdentity(t, f))
	auds := audiences(130)
	for i, r := range coalesce(t, b, f, auds) {
		assertOwnToken(t, r, agentID, auds[i])
	}
	assert.Equal(t, []int{1, 1, 2, 64, 64}, f.batchSizes())
	var sent []string
	for _, batch := range f.batchAudiences()[2:] {
		sent = append(sent, batch...)
	}
	assert.ElementsMatch(t, auds, sent, "each mint sent once")
}

// Each item of a batch is answered on its own: a refusal reaches its
// caller as the gRPC status the server gave, the others get their
// tokens; an item answered with neither a token nor a refusal fails.
func TestJWTBatcherItemResults(t *testing.T) {
	f := newBatchIdentity(2)
	f.answer = func(reqs []*identityapi.MintJWTSVIDRequest) (*identityapi.MintJWTSVIDsResponse, error) {
		resp := mintAll(reqs)
		for i, r := range reqs {
			switch r.GetAudience()[0] {
			case "refused":
				resp.Results[i] = &identityapi.MintJWTSVIDResult{Code: int32(codes.PermissionDenied), Message: "audience refused by policy"}
			case "empty":
				resp.Results[i] = &identityapi.MintJWTSVIDResult{}
			}
		}
		return resp, nil
	}
	b := NewJWTBatcher(serveIdentity(t, f))
	got := coalesce(t, b, f, []string{"ok-0", "refused", "empty", "ok-1"})
	require.Equal(t, []int{1, 1, 4}, f.batchSizes())

	assertOwnToken(t, got[0], agentID, "ok-0")
	assertOwnToken(t, got[3], agentID, "ok-1")
	st, ok := status.FromError(got[1].err)
	require.True(t, ok, "a refusal is a gRPC status: %v", got[1].err)
	assert.Equal(t, codes.PermissionDenied, st.Code())
	assert.Equal(t, "audience refused by policy", st.Message())
	assert.Nil(t, got[1].svid)
	assert.ErrorContains(t, got[2].err, "neither a token nor a refusal")
	assert.Nil(t, got[2].svid)
}

// A batch answered as a whole, with an error or with a wrong number of
// results, fails every mint it carried, and only those.
func TestJWTBatcherBatchFails(t *testing.T) {
	for _, tc := range []struct {
		name     string
		answer   func([]*identityapi.MintJWTSVIDRequest) (*identityapi.MintJWTSVIDsResponse, error)
		wantCode codes.Code
		wantErr  string
	}{
		{"too few results", func(reqs []*identityapi.MintJWTSVIDRequest) (*identityapi.MintJWTSVIDsResponse, error) {
			return mintAll(reqs[1:]), nil
		}, codes.Unknown, "answered 3 JWT-SVID requests with 2 results"},
		{"too many results", func(reqs []*identityapi.MintJWTSVIDRequest) (*identityapi.MintJWTSVIDsResponse, error) {
			return mintAll(append(reqs, reqs[0])), nil
		}, codes.Unknown, "answered 3 JWT-SVID requests with 4 results"},
		{"no results", func([]*identityapi.MintJWTSVIDRequest) (*identityapi.MintJWTSVIDsResponse, error) {
			return &identityapi.MintJWTSVIDsResponse{}, nil
		}, codes.Unknown, "answered 3 JWT-SVID requests with 0 results"},
		{"refused as a whole", func([]*identityapi.MintJWTSVIDRequest) (*identityapi.MintJWTSVIDsResponse, error) {
			return nil, status.Error(codes.ResourceExhausted, "batch too large")
		}, codes.ResourceExhausted, "batch too large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newBatchIdentity(2)
			f.answer = func(reqs []*identityapi.MintJWTSVIDRequest) (*identityapi.MintJWTSVIDsResponse, error) {
				if len(reqs) == 1 {
					return mintAll(reqs), nil
				}
				return tc.answer(reqs)
			}
			b := NewJWTBatcher(serveIdentity(t, f))
			for _, r := range coalesce(t, b, f, audiences(3)) {
				assert.ErrorContains(t, r.err, tc.wantErr)
				assert.Equal(t, tc.wantCode, status.Code(r.err))
				assert.Nil(t, r.svid)
			}
			assert.Equal(t, []int{1, 1, 3}, f.batchSizes())
			assert.Zero(t, f.unaryCalls(), "a failed batch is not retried")
		})
	}
}

// A token for a workload whose subject is not that workload is refused,
// as MintJWTSVIDFor refuses it: an older server ignores the field and
// signs the caller. The other items of the batch are handed out.
func TestJWTBatcherChecksSubject(t *testing.T) {
	web := spiffeid.RequireFromString("spiffe://a.example/ns/shop/sa/web")
	db := spiffeid.RequireFromString("spiffe://a.example/ns/shop/sa/db")
	f := newBatchIdentity(2)
	f.answer = func(reqs []*identityapi.MintJWTSVIDRequest) (*identityapi.MintJWTSVIDsResponse, error) {
		resp := mintAll(reqs)
		for i, r := range reqs {
			if r.GetImpersonatedIdentity() == web.String() {
				resp.Results[i].Svid.SpiffeId = agentID
			}
		}
		return resp, nil
	}
	b := NewJWTBatcher(serveIdentity(t, f))
	held := holdTwo(t, b, f)
	forWeb := startMint(t.Context(), b, web, "aud-web")
	forDB := startMint(t.Context(), b, db, "aud-db")
	waitQueued(b, 2)
	f.release()
	for _, ch := range held {
		require.NoError(t, (<-ch).err)
	}
	r := <-forWeb
	assert.ErrorContains(t, r.err, "minted a JWT-SVID for "+agentID+", not for "+web.String())
	assert.Nil(t, r.svid, "a token of someone else is never handed out")
	assertOwnToken(t, <-forDB, db.String(), "aud-db")
	assert.Equal(t, []int{1, 1, 2}, f.batchSizes())
}

// A server that predates MintJWTSVIDs answers Unimplemented: every mint
// on the wire or waiting then makes its own MintJWTSVID call, and so does
// every later mint, without another MintJWTSVIDs call.
func TestJWTBatcherUnimplemented(t *testing.T) {
	f := newBatchIdentity(2)
	f.unimplemented.Store(true)
	b := NewJWTBatcher(serveIdentity(t, f))
	var elapsed atomic.Int64 // since start, for b's clock
	start := time.Now()
	b.now = func() time.Time { return start.Add(time.Duration(elapsed.Load())) }
	auds := audiences(3)
	for i, r := range coalesce(t, b, f, auds) {
		assertOwnToken(t, r, agentID, auds[i])
	}
	assert.Equal(t, []int{1, 1}, f.batchSizes(), "no batch is sent once the server said it does not batch")
	assert.Equal(t, 5, f.unaryCalls(), "each mint made its own call")

	web := spiffeid.RequireFromString("spiffe://a.example/ns/shop/sa/web")
	r := <-startMint(t.Context(), b, web, "later")
	assertOwnToken(t, r, web.String(), "later")
	assert.Equal(t, []int{1, 1}, f.batchSizes())
	require.Equal(t, 6, f.unaryCalls())
	assert.Equal(t, web.String(), f.unaryReq(5).GetImpersonatedIdentity())

	// Ten minutes on (the server upgraded meanwhile), a batch is tried
	// again; just before, still one call a token.
	elapsed.Store(int64(jwtUnbatchedFor - time.Second))
	assertOwnToken(t, <-startMint(t.Context(), b, spiffeid.ID{}, "still"), agentID, "still")
	require.Equal(t, 7, f.unaryCalls())
	f.unimplemented.Store(false)
	elapsed.Store(int64(jwtUnbatchedFor + time.Second))
	assertOwnToken(t, <-startMint(t.Context(), b, spiffeid.ID{}, "again"), agentID, "again")
	assert.Equal(t, []int{1, 1, 1}, f.batchSizes(), "batching tried again")
	assert.Equal(t, 7, f.unaryCalls())
}

// A mint whose caller leaves while it waits returns the context's error
// at once and is taken off the queue: the next call does not carry it.
func TestJWTBatcherCallerLeavesQueue(t *testing.T) {
	f := newBatchIdentity(2)
	b := NewJWTBatcher(serveIdentity(t, f))
	held := holdTwo(t, b, f)
	ctx, cancel := context.WithCancel(t.Context())
	leaving := startMint(ctx, b, spiffeid.ID{}, "leaving")
	waitQueued(b, 1)
	staying := []<-chan mintResult{startMint(t.Context(), b, spiffeid.ID{}, "stay-0"), startMint(t.Context(), b, spiffeid.ID{}, "stay-1")}
	waitQueued(b, 3)

	cancel()
	r := <-leaving // before any held call is answered
	assert.ErrorIs(t, r.err, context.Canceled)
	assert.Nil(t, r.svid)
	assert.Equal(t, 2, queued(b), "the mint that left is off the queue")

	f.release()
	for i, ch := range held {
		assertOwnToken(t, <-ch, agentID, fmt.Sprint("held-", i))
	}
	for i, ch := range staying {
		assertOwnToken(t, <-ch, agentID, fmt.Sprint("stay-", i))
	}
	require.Equal(t, []int{1, 1, 2}, f.batchSizes())
	assert.ElementsMatch(t, []string{"stay-0", "stay-1"}, f.batchAudiences()[2])
}

// The call that carries others' mints is not cancelled by the context of
// the mint that started it: here the mint whose answer starts the next
// call has left, and that call still mints for the others. The mint that
// left returns at once, while its own call is still on the wire.
func TestJWTBatcherStarterLeaves(t *testing.T) {
	f := newBatchIdentity(2)
	b := NewJWTBatcher(serveIdentity(t, f))
	ctx, cancel := context.WithCancel(t.Context())
	starter := startMint(ctx, b, spiffeid.ID{}, "starter")
	<-f.arrived // the first held call: gates[0]
	other := startMint(t.Context(), b, spiffeid.ID{}, "other")
	<-f.arrived
	queuedMints := []<-chan mintResult{startMint(t.Context(), b, spiffeid.ID{}, "q-0"), startMint(t.Context(), b, spiffeid.ID{}, "q-1")}
	waitQueued(b, 2)

	cancel()
	r := <-starter // before its call is answered
	assert.ErrorIs(t, r.err, context.Canceled)
	assert.Nil(t, r.svid)

	// The starter's call is answered, and the queued mints go out on a
	// call started with its (ended) context's values.
	close(f.gates[0])
	for i, ch := range queuedMints {
		assertOwnToken(t, <-ch, agentID, fmt.Sprint("q-", i))
	}
	require.Equal(t, []int{1, 1, 2}, f.batchSizes())
	assert.Equal(t, []string{"starter"}, f.batchAudiences()[0])

	close(f.gates[1])
	assertOwnToken(t, <-other, agentID, "other")
}

// A negative lifetime is refused before any call.
func TestJWTBatcherNegativeTTL(t *testing.T) {
	f := newBatchIdentity(0)
	b := NewJWTBatcher(serveIdentity(t, f))
	svid, err := b.Mint(t.Context(), spiffeid.ID{}, []string{"db"}, -time.Second)
	assert.ErrorContains(t, err, "lifetime -1s is negative")
	assert.Nil(t, svid)
	assert.Empty(t, f.batchSizes())
	assert.Zero(t, f.unaryCalls())
	assert.Zero(t, queued(b))
}

// startMintFor is startMint with the audiences auds.
func startMintFor(ctx context.Context, b *JWTBatcher, workload spiffeid.ID, auds []string) <-chan mintResult {
	ch := make(chan mintResult, 1)
	go func() {
		svid, err := b.Mint(ctx, workload, auds, 0)
		ch <- mintResult{svid, err}
	}()
	return ch
}

// longAudiences are n audiences of size bytes, tagged with tag.
func longAudiences(tag string, n, size int) []string {
	auds := make([]string, n)
	for i := range auds {
		p := fmt.Sprint(tag, "-", i, "-")
		auds[i] = p + strings.Repeat("x", size-len(p))
	}
	return auds
}

// The server refuses as a whole a batch over its bounds: one workload's
// request larger than the server takes is refused alone, and large
// requests go out in calls small enough, so that no workload's mint
// fails for what others asked.
func TestJWTBatcherBoundsBytes(t *testing.T) {
	t.Run("oversized request alone", func(t *testing.T) {
		f := newBatchIdentity(2)
		b := NewJWTBatcher(serveIdentity(t, f))
		web := spiffeid.RequireFromString("spiffe://a.example/ns/shop/sa/web")
		held := holdTwo(t, b, f)
		// 20 audiences of 600 bytes: within the Workload API's bounds, not
		// within the server's.
		big := startMintFor(t.Context(), b, web, longAudiences("big", 20, 600))
		small := []<-chan mintResult{startMint(t.Context(), b, spiffeid.ID{}, "small-0"), startMint(t.Context(), b, spiffeid.ID{}, "small-1")}
		waitQueued(b, 2)
		f.release()
		for i, ch := range held {
			assertOwnToken(t, <-ch, agentID, fmt.Sprint("held-", i))
		}
		for i, ch := range small {
			assertOwnToken(t, <-ch, agentID, fmt.Sprint("small-", i))
		}
		r := <-big
		assert.Equal(t, codes.ResourceExhausted, status.Code(r.err), "%v", r.err)
		assert.Nil(t, r.svid)
	})
	t.Run("large requests split by size", func(t *testing.T) {
		f := newBatchIdentity(2)
		b := NewJWTBatcher(serveIdentity(t, f))
		held := holdTwo(t, b, f)
		// 15 audiences of 512 bytes and one of 462: 8190 bytes a request,
		// 8193 framed in a call, so 7 to a call (8 fit unframed).
		var chans []<-chan mintResult
		var auds [][]string
		for i := range 12 {
			auds = append(auds, append(longAudiences(fmt.Sprint("aud", i), 15, 512), longAudiences(fmt.Sprint("last", i), 1, 462)...))
			require.Equal(t, 8190, proto.Size(&identityapi.MintJWTSVIDRequest{Audience: auds[i]}))
			chans = append(chans, startMintFor(t.Context(), b, spiffeid.ID{}, auds[i]))
		}
		waitQueued(b, 12)
		f.release()
		for _, ch := range held {
			require.NoError(t, (<-ch).err)
		}
		for i, ch := range chans {
			r := <-ch
			if assert.NoError(t, r.err, i) {
				assert.Equal(t, tokenFor(agentID, auds[i]...), r.svid.Token, i)
			}
		}
		assert.Equal(t, []int{1, 1, 5, 7}, f.batchSizes())
	})
}
