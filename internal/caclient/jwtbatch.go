package caclient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// Bounds of the batches a JWTBatcher sends: the server's
// (identityapi.MaxMintBatch items, identityapi.MaxMintBatchBytes), and
// two calls on the wire at once, so that a burst of mints becomes a few
// calls while the server still gets work for two cores. The server
// refuses as a whole a call over the byte bound or holding an item over
// identityapi.MaxMintRequestBytes: one workload's request must not fail
// the mints of the others in its call, so calls are cut by size too and
// a larger item is sent alone, to be refused on its own.
const (
	maxJWTBatchesInFlight = 2
	// jwtUnbatchedFor is how long a batcher makes one call a token after
	// the server answered MintJWTSVIDs Unimplemented (a server, or a
	// replica behind the same address during an upgrade, that predates
	// it) before it tries a batch again.
	jwtUnbatchedFor = 10 * time.Minute
	// jwtBatchTimeout bounds one MintJWTSVIDs call: it carries many
	// callers' mints, so no one caller's context may cancel it.
	jwtBatchTimeout = 30 * time.Second
)

// JWTBatcher mints JWT-SVIDs on one connection, coalescing the mints
// asked for at once into MintJWTSVIDs calls: a mint asked while two
// calls are on the wire waits for the next call, which carries every
// mint that waited meanwhile (up to 64, and 64 KiB: a request too large
// for any call is sent alone, as MintJWTSVID). A mint alone is sent at
// once, so batching adds no delay to a quiet agent. Against a server that
// predates MintJWTSVIDs (Unimplemented) every mint is its own
// MintJWTSVID call for the next 10 minutes, then a batch is tried again.
// It is safe for concurrent use.
type JWTBatcher struct {
	conn grpc.ClientConnInterface

	mu       sync.Mutex
	queue    []*pendingMint
	inFlight int
	// unaryUntil is when, in Unix nanoseconds of now, a batch is tried
	// again after the server answered MintJWTSVIDs Unimplemented.
	unaryUntil atomic.Int64
	now        func() time.Time
}

// NewJWTBatcher mints on conn, a connection from Dial.
func NewJWTBatcher(conn grpc.ClientConnInterface) *JWTBatcher {
	return &JWTBatcher{conn: conn, now: time.Now}
}

// unary says whether mints are sent one a call now.
func (b *JWTBatcher) unary() bool {
	return b.now().UnixNano() < b.unaryUntil.Load()
}

// pendingMint is one mint waiting for its batch's answer.
type pendingMint struct {
	workload spiffeid.ID
	req      *identityapi.MintJWTSVIDRequest
	size     int           // the bytes req adds to a MintJWTSVIDsRequest
	done     chan struct{} // closed once svid or err is set
	svid     *JWTSVID
	err      error
}

// errUnbatched tells a waiting mint to make its own MintJWTSVID call.
var errUnbatched = errors.New("the server does not batch")

// Mint is MintJWTSVID (workload zero) or MintJWTSVIDFor (workload set),
// batched with the mints other goroutines ask for at the same time. The
// call carrying it runs under a context of its own, bounded by 30 s,
// since it carries other callers' mints; ctx ending returns ctx's error
// at once.
func (b *JWTBatcher) Mint(ctx context.Context, workload spiffeid.ID, audience []string, ttl time.Duration) (*JWTSVID, error) {
	req, err := mintRequest(workload, audience, ttl)
	if err != nil {
		return nil, err
	}
	size := proto.Size(req)
	if b.unary() || size > identityapi.MaxMintRequestBytes {
		return mintWith(ctx, b.conn, workload, req)
	}
	p := &pendingMint{workload: workload, req: req, size: protowire.SizeTag(1) + protowire.SizeBytes(size), done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, p)
	batch := b.takeLocked()
	b.mu.Unlock()
	if batch != nil {
		// On a goroutine of its own, as the calls started after it: a
		// caller that leaves returns at once rather than when the call
		// ends (up to jwtBatchTimeout later).
		go b.send(batch)
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		b.drop(p)
		return nil, ctx.Err()
	}
	if errors.Is(p.err, errUnbatched) {
		return mintWith(ctx, b.conn, workload, req)
	}
	return p.svid, p.err
}

// takeLocked takes the next batch off the queue when a call may start,
// counting it in flight; nil when none may or none waits. b.mu is held.
func (b *JWTBatcher) takeLocked() []*pendingMint {
	if len(b.queue) == 0 || b.inFlight >= maxJWTBatchesInFlight {
		return nil
	}
	n, size := 1, b.queue[0].size
	for n < min(len(b.queue), identityapi.MaxMintBatch) && size+b.queue[n].size <= identityapi.MaxMintBatchBytes {
		size += b.queue[n].size
		n++
	}
	batch := b.queue[:n:n]
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil
	}
	b.inFlight++
	return batch
}

// drop takes p off the queue when its caller left before it was sent. A
// mint already on the wire is minted and its answer dropped.
func (b *JWTBatcher) drop(p *pendingMint) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, q := range b.queue {
		if q == p {
			b.queue = append(b.queue[:i:i], b.queue[i+1:]...)
			return
		}
	}
}

// send makes batch's call, answers its mints and, when mints waited
// meanwhile, starts the next call on a goroutine of its own.
func (b *JWTBatcher) send(batch []*pendingMint) {
	callCtx, cancel := context.WithTimeout(context.Background(), jwtBatchTimeout)
	defer cancel()
	reqs := make([]*identityapi.MintJWTSVIDRequest, len(batch))
	for i, p := range batch {
		reqs[i] = p.req
	}
	resp, err := identityapi.NewIdentityServiceClient(b.conn).MintJWTSVIDs(callCtx, &identityapi.MintJWTSVIDsRequest{Requests: reqs})
	if status.Code(err) == codes.Unimplemented {
		b.unaryUntil.Store(b.now().Add(jwtUnbatchedFor).UnixNano())
		err = errUnbatched
	}
	results := resp.GetResults()
	if err == nil && len(results) != len(batch) {
		err = fmt.Errorf("the server answered %d JWT-SVID requests with %d results", len(batch), len(results))
	}
	for i, p := range batch {
		if err != nil {
			p.err = err
		} else {
			p.svid, p.err = batchResult(p.workload, results[i])
		}
		close(p.done)
	}
	b.mu.Lock()
	b.inFlight--
	var unbatched []*pendingMint
	if b.unary() {
		// What waited meanwhile makes its own calls: sending it as a
		// batch would only be answered Unimplemented again.
		unbatched, b.queue = b.queue, nil
	}
	next := b.takeLocked()
	b.mu.Unlock()
	for _, p := range unbatched {
		p.err = errUnbatched
		close(p.done)
	}
	if next != nil {
		go b.send(next)
	}
}

// batchResult is one item's answer: its token, or the status the server
// refused it with.
func batchResult(workload spiffeid.ID, r *identityapi.MintJWTSVIDResult) (*JWTSVID, error) {
	if r.GetSvid() == nil {
		if r.GetCode() == int32(codes.OK) {
			return nil, errors.New("the server answered a JWT-SVID request with neither a token nor a refusal")
		}
		return nil, status.Error(codes.Code(r.GetCode()), r.GetMessage())
	}
	return checkMinted(workload, r.GetSvid())
}
