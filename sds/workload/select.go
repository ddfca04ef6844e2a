package workload

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// DefaultReselectInterval is Config.ReselectInterval's default, the
// SDS server's re-authentication interval (sds.DefaultReauthInterval).
const DefaultReselectInterval = 10 * time.Minute

// Selector decides which Source serves the caller of a Workload API call:
// a node agent attests the process at the other end of the socket and
// answers the Source of the identity its facts grant.
type Selector interface {
	// Select is called with the context of each stream and unary call
	// (its peer, the AuthInfo of Config.Credentials, its metadata), and
	// again during a stream (see Config.ReselectInterval). It returns the
	// caller's Source, and release (nil: nothing to release), which the
	// server calls once when it stops using that Source for the call.
	// Callers of one identity should get the same Source value (the same
	// *Cell): a stream that re-selects compares Sources with == to know
	// whether its caller's identity moved, and a Cell's State is encoded
	// once for all its streams.
	//
	// An error refuses the call, its text returned to the caller: one
	// wrapping authn.ErrUnavailable (attestation cannot decide right now)
	// with Unavailable, any other (not attested, no identity) with
	// PermissionDenied.
	Select(ctx context.Context) (src Source, release func(), err error)
}

// SelectorFunc adapts a function to a Selector.
type SelectorFunc func(ctx context.Context) (Source, func(), error)

// Select calls f.
func (f SelectorFunc) Select(ctx context.Context) (Source, func(), error) { return f(ctx) }

// CallerJWTMinter mints JWT-SVIDs for the identity it is given. With a
// Selector the server asks only for the caller's own: the SVID.ID of the
// State its selected Source holds.
type CallerJWTMinter interface {
	MintJWTSVIDFor(ctx context.Context, id spiffeid.ID, audience []string) (token string, err error)
}

// selection is the Source serving one call, the reference its States not
// published by a Cell are encoded against, and what to call when the call
// is done with it.
type selection struct {
	src     Source
	ref     *encRef
	release func()
}

// done releases sel's Source; once.
func (sel *selection) done() {
	if sel.release != nil {
		sel.release()
		sel.release = nil
	}
}

// selectSource returns the Source serving the call whose context ctx is:
// Config.Source's for every call, or the Selector's answer for this one.
// A refusal is logged, counted and returned as the call's status.
func (s *Server) selectSource(ctx context.Context, method string) (*selection, error) {
	if s.selector == nil {
		return &selection{src: s.src, ref: &s.ref}, nil
	}
	src, release, err := s.selector.Select(ctx)
	if err == nil {
		err = checkSelected(src)
	}
	if err != nil {
		if release != nil {
			release()
		}
		return nil, s.refuse(ctx, method, err)
	}
	return &selection{src: src, ref: &encRef{}, release: release}, nil
}

// checkSelected refuses what a Selector must not answer without an error:
// no Source, or one that == cannot compare.
func checkSelected(src Source) error {
	switch {
	case src == nil:
		return errSelectorNoSource
	case !reflect.TypeOf(src).Comparable():
		return errSelectorIncomparable
	}
	return nil
}

var (
	errSelectorNoSource     = errors.New("the selector returned no source and no error")
	errSelectorIncomparable = errors.New("the selector returned a source of a type == cannot compare; return a pointer")
)

// reselect runs the Selector again for a stream that holds sel: the same
// Source keeps sel, another replaces it (sel is released). On a refusal
// it returns sel, still to be released, and the status that ends the
// stream: it never goes on serving an identity its caller no longer has.
// With one Source it returns sel.
func (s *Server) reselect(ctx context.Context, method string, sel *selection) (*selection, error) {
	if s.selector == nil {
		return sel, nil
	}
	next, err := s.selectSource(ctx, method)
	if err != nil {
		return sel, err
	}
	if next.src == sel.src {
		next.done()
		return sel, nil
	}
	sel.done()
	return next, nil
}

// refuse maps a Selector's error to the call's status, counts and logs it.
func (s *Server) refuse(ctx context.Context, method string, err error) error {
	var code codes.Code
	switch {
	case ctx.Err() != nil:
		// The caller went away while being attested: not a refusal.
		return status.FromContextError(ctx.Err()).Err()
	case errors.Is(err, errSelectorNoSource), errors.Is(err, errSelectorIncomparable):
		code = codes.Internal
	case errors.Is(err, authn.ErrUnavailable):
		code = codes.Unavailable
	default:
		code = codes.PermissionDenied
	}
	s.metrics.refusals.WithLabelValues(method, code.String()).Inc()
	// Any process that can open the socket provokes refusals at will:
	// bounded lines. Only a Selector's fault is ours, and always an Error.
	lvl := slog.LevelError
	switch code {
	case codes.Unavailable:
		lvl = s.refuseLog.Level(slog.LevelWarn)
	case codes.PermissionDenied:
		lvl = s.refuseLog.Level(slog.LevelInfo)
	}
	attrs := []any{"method", method, "code", code.String(), logattr.Error, err.Error()}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		attrs = append(attrs, logattr.Address, p.Addr.String())
	}
	s.log.Log(ctx, lvl, "Workload API call refused: no identity selected for the caller", attrs...)
	if code == codes.Internal {
		return status.Error(code, "the server could not select the caller's identity")
	}
	return status.Error(code, err.Error())
}
