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
	results := make([]*identityapi.MintJWTSVIDResult, len(items))
	refuse := func(i int, ref *refusal) {
		s.metrics.jwtSVIDs.WithLabelValues(ref.code.String(), methodLabel(ident)).Inc()
		err := s.refuse(ctx, "jwt-svid request refused", r, ident, ref, "item", i)
		results[i] = &identityapi.MintJWTSVIDResult{Code: int32(ref.code), Message: status.Convert(err).Message()}
	}
	// Every item is judged and charged first, in order; a caller that
	// left stops the rest.
	decided := make([]mintDecision, len(items))
	var accepted []int
	for i, item := range items {
		if err := ctx.Err(); err != nil {
			refuse(i, callerLeft(err))
			continue
		}
		d, ref := s.decideMint(ctx, ident, item)
		if ref != nil {
			refuse(i, ref)
			continue
		}
		decided[i] = d
		accepted = append(accepted, i)
	}
	if len(accepted) == 0 {
		return &identityapi.MintJWTSVIDsResponse{Results: results}, nil
	}
	// The batch then waits in the signing queue once, as one request of
	// its size (the places of everything its call holds), and its tokens
	// are signed one after another in the slot it gets: its wait is a
	// request's, not one per token, and it takes no more of the server's
	// signing at once than a request does.
	release, ref := s.admission.acquire(ctx, proto.Size(req), true)
	if ref == nil {
		defer release()
	}
	for _, i := range accepted {
		if ref == nil && ctx.Err() != nil {
			ref = callerLeft(ctx.Err()) // nobody will read the rest
		}
		if ref != nil {
			refuse(i, ref)
			continue
		}
		resp, signRef := s.signMint(ctx, r, ident, decided[i])
		if signRef != nil {
			refuse(i, signRef)
			continue
		}
		s.metrics.jwtSVIDs.WithLabelValues(codes.OK.String(), methodLabel(ident)).Inc()
		results[i] = &identityapi.MintJWTSVIDResult{Svid: resp}
	}
	return &identityapi.MintJWTSVIDsResponse{Results: results}, nil
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
