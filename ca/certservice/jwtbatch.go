package certservice

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// Bounds of a MintJWTSVIDs batch (identityapi's): a node agent sends
// what its workloads asked for while its previous batches were on the
// wire, a few to a few dozen tokens; each item is a MintJWTSVID request
// within its own bounds.
const (
	// MaxMintBatch is the most tokens one MintJWTSVIDs call may ask for.
	MaxMintBatch = identityapi.MaxMintBatch
	// MaxMintBatchSize bounds a MintJWTSVIDs request.
	MaxMintBatchSize = identityapi.MaxMintBatchBytes
)

// MintJWTSVIDs mints a batch of JWT-SVIDs for the caller, each item
// decided as MintJWTSVID decides a request.
func (is *identityService) MintJWTSVIDs(ctx context.Context, req *identityapi.MintJWTSVIDsRequest) (*identityapi.MintJWTSVIDsResponse, error) {
	s := is.s
	r := authn.FromGRPC(ctx)
	items := req.GetRequests()
	ident, ref := s.checkMintBatch(ctx, r, req)
	if ref != nil {
		s.metrics.jwtSVIDs.WithLabelValues(ref.code.String(), methodLabel(ident)).Add(float64(refusedCount(len(items))))
		return nil, s.refuse(ctx, "jwt-svid batch refused", r, ident, ref, "items", len(items))
	}
	results := make([]*identityapi.MintJWTSVIDResult, len(items))
	// An item waiting for a signing slot holds the whole batch: it takes
	// the queue places of the batch, not of itself, or a batch of many
	// small items would hold up to 64 KiB on a place or two, past the
	// queue's memory bound (admission's queueUnit). The usual batch, a
	// few small items, still takes one place an item.
	held := proto.Size(req)
	one := func(i int) {
		resp, ref := s.mintFor(ctx, r, ident, items[i], held)
		if ref != nil {
			s.metrics.jwtSVIDs.WithLabelValues(ref.code.String(), methodLabel(ident)).Inc()
			err := s.refuse(ctx, "jwt-svid request refused", r, ident, ref, "item", i)
			results[i] = &identityapi.MintJWTSVIDResult{Code: int32(ref.code), Message: statusMessage(err)}
			return
		}
		s.metrics.jwtSVIDs.WithLabelValues(codes.OK.String(), methodLabel(ident)).Inc()
		results[i] = &identityapi.MintJWTSVIDResult{Svid: resp}
	}
	runBatch(len(items), batchWorkers(len(items)), one)
	return &identityapi.MintJWTSVIDsResponse{Results: results}, nil
}

// refusedCount is what a batch of n items refused as a whole adds to the
// JWT-SVID counter: every token it asked for, or one for a batch
// malformed by its length, so that a caller cannot add thousands with one
// call.
func refusedCount(n int) int {
	if n < 1 || n > MaxMintBatch {
		return 1
	}
	return n
}

// checkMintBatch authenticates a MintJWTSVIDs caller once for the whole
// batch, or says why the batch is refused as a whole.
func (s *Service) checkMintBatch(ctx context.Context, r authn.Request, req *identityapi.MintJWTSVIDsRequest) (authn.Identity, *refusal) {
	n := len(req.GetRequests())
	switch {
	case s.cfg.JWT == nil:
		return authn.Identity{}, errJWTNotConfigured
	case proto.Size(req) > MaxMintBatchSize:
		return authn.Identity{}, &refusal{codes.ResourceExhausted, "too_large",
			fmt.Sprintf("batch larger than %d bytes; send at most %d tokens' requests a call", MaxMintBatchSize, MaxMintBatch), nil}
	case n == 0:
		return authn.Identity{}, &refusal{codes.InvalidArgument, "empty_batch", "the batch asks for no token: send at least one request", nil}
	case n > MaxMintBatch:
		return authn.Identity{}, &refusal{codes.InvalidArgument, "batch_too_long",
			fmt.Sprintf("the batch asks for %d tokens; at most %d are allowed a call", n, MaxMintBatch), nil}
	}
	for i, item := range req.GetRequests() {
		if proto.Size(item) > maxMintRequestSize {
			ref := mintTooLarge()
			ref.msg = fmt.Sprintf("item %d: %s", i, ref.msg)
			return authn.Identity{}, ref
		}
	}
	return s.authenticate(ctx, r, s.identityAuth)
}

// statusMessage is the message of a gRPC status error.
func statusMessage(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Message()
	}
	return err.Error()
}

// tokensPerWorker is how many of a batch's tokens one goroutine signs
// before another is worth starting. A goroutine handed a token or two
// costs more in the scheduler's wake-ups than it saves: measured with
// signbench's trustbridge-batched row on 2 cores, batches of 4 cost
// 10-15% less server CPU a token signed on one goroutine than on two,
// while batches of 32 on two cost about 5% more CPU than on one and are
// answered sooner (one agent's throughput 5-10% higher here, and a batch
// of 64 on a larger server waits for one core's 64 signatures no more).
const tokensPerWorker = 8

// batchWorkers is how many goroutines sign a batch of n tokens: one per
// tokensPerWorker, at most GOMAXPROCS.
func batchWorkers(n int) int {
	return max(1, min(runtime.GOMAXPROCS(0), n/tokensPerWorker))
}

// runBatch calls do for 0..n-1 on up to workers goroutines, the caller's
// among them, and returns when all returned. A batch's tokens are signed
// side by side as separate calls would be: one agent's batch may use
// every core, each signing still waiting its turn in the signing queue.
func runBatch(n, workers int, do func(i int)) {
	workers = min(workers, n)
	var (
		mu   sync.Mutex
		next int
		wg   sync.WaitGroup
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if next == n {
			return 0, false
		}
		next++
		return next - 1, true
	}
	work := func() {
		for i, ok := take(); ok; i, ok = take() {
			do(i)
		}
	}
	for range workers - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
}
