package certservice

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/identityapi"
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
	b := &mintBatch{s: s, ctx: ctx, r: r, ident: ident, results: make([]*identityapi.MintJWTSVIDResult, len(items))}
	if decided := b.decide(items); len(decided) > 0 {
		b.sign(proto.Size(req), decided)
	}
	return &identityapi.MintJWTSVIDsResponse{Results: b.results}, nil
}

// mintBatch is one MintJWTSVIDs call's items being answered.
type mintBatch struct {
	s       *Service
	ctx     context.Context
	r       authn.Request
	ident   authn.Identity
	results []*identityapi.MintJWTSVIDResult
}

// decidedItem is an item that passed decideMint, by its index.
type decidedItem struct {
	i int
	d mintDecision
}

// decide judges and charges every item, in order, answering those
// refused; a caller that left stops the rest.
func (b *mintBatch) decide(items []*identityapi.MintJWTSVIDRequest) []decidedItem {
	var decided []decidedItem
	for i, item := range items {
		if err := b.ctx.Err(); err != nil {
			b.refuse(i, callerLeft(err))
			continue
		}
		d, ref := b.s.decideMint(b.ctx, b.ident, item)
		if ref != nil {
			b.refuse(i, ref)
			continue
		}
		decided = append(decided, decidedItem{i, d})
	}
	return decided
}

// sign waits in the signing queue once, as one request of size (the
// places of everything the call holds), and signs the decided tokens one
// after another in the slot it gets: the batch's wait is a request's,
// not one per token, and it takes no more of the server's signing at once
// than a request does. A caller that left is signed nothing more.
func (b *mintBatch) sign(size int, decided []decidedItem) {
	release, ref := b.s.admission.acquire(b.ctx, size, true)
	if ref == nil {
		defer release()
	}
	for _, it := range decided {
		if ref == nil && b.ctx.Err() != nil {
			ref = callerLeft(b.ctx.Err()) // nobody will read the rest
		}
		if ref != nil {
			b.refuse(it.i, ref)
			continue
		}
		resp, signRef := b.s.signMint(b.ctx, b.r, b.ident, it.d)
		if signRef != nil {
			b.refuse(it.i, signRef)
			continue
		}
		b.s.metrics.jwtSVIDs.WithLabelValues(codes.OK.String(), methodLabel(b.ident)).Inc()
		b.results[it.i] = &identityapi.MintJWTSVIDResult{Svid: resp}
	}
}

// refuse answers item i with ref, counted and logged as MintJWTSVID's
// refusals are.
func (b *mintBatch) refuse(i int, ref *refusal) {
	b.s.metrics.jwtSVIDs.WithLabelValues(ref.code.String(), methodLabel(b.ident)).Inc()
	err := b.s.refuse(b.ctx, "jwt-svid request refused", b.r, b.ident, ref, "item", i)
	b.results[i] = &identityapi.MintJWTSVIDResult{Code: int32(ref.code), Message: status.Convert(err).Message()}
}

// refusedCount is what a batch of n items refused as a whole adds to the
// JWT-SVID counter: every token it asked for, or one for a batch
// malformed by its length, so that a caller cannot add thousands with one
// call.
func refusedCount(n int) int {
	if n < 1 || n > identityapi.MaxMintBatch {
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
	case proto.Size(req) > identityapi.MaxMintBatchBytes:
		return authn.Identity{}, &refusal{codes.ResourceExhausted, "too_large",
			fmt.Sprintf("batch larger than %d bytes; send at most %d tokens' requests a call", identityapi.MaxMintBatchBytes, identityapi.MaxMintBatch), nil}
	case n == 0:
		return authn.Identity{}, &refusal{codes.InvalidArgument, "empty_batch", "the batch asks for no token: send at least one request", nil}
	case n > identityapi.MaxMintBatch:
		return authn.Identity{}, &refusal{codes.InvalidArgument, "batch_too_long",
			fmt.Sprintf("the batch asks for %d tokens; at most %d are allowed a call", n, identityapi.MaxMintBatch), nil}
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
