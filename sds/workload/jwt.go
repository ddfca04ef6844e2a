package workload

import (
	"context"
	"maps"
	"strings"
	"unicode"

	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	spiffejwt "github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/trustbridge/trustbridge/internal/jwtsvid"
)

// Limits on the audiences of one FetchJWTSVID: each is minted into a
// token and, upstream, into a cache key.
const (
	maxAudiences    = 32
	maxAudienceSize = 1024
)

// FetchJWTSVID mints a JWT-SVID for the caller's identity (Workload API
// §6.2): the audience is required, and a spiffe_id other than the
// caller's is refused, since the workload is entitled to that one only.
func (s *Server) FetchJWTSVID(ctx context.Context, req *workloadpb.JWTSVIDRequest) (*workloadpb.JWTSVIDResponse, error) {
	if err := CheckAudience(req.GetAudience()); err != nil {
		return nil, err
	}
	sel, err := s.selectSource(ctx, "FetchJWTSVID")
	if err != nil {
		return nil, err
	}
	defer sel.done()
	st, _ := sel.src.State()
	if st.SVID == nil {
		return nil, errNoIdentity
	}
	id := st.SVID.ID
	if want := req.GetSpiffeId(); want != "" {
		asked, err := spiffeid.FromString(want)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "spiffe_id %q: %v", want, err)
		}
		if asked != id {
			return nil, status.Errorf(codes.PermissionDenied, "this workload is entitled to %s only, not %s", id, asked)
		}
	}
	token, err := s.mint(ctx, id, req.GetAudience())
	if err != nil {
		return nil, err
	}
	// The minter is upstream of this server: what it returns is checked
	// to be the caller's identity's before a workload gets it.
	svid, err := spiffejwt.ParseInsecure(token, req.GetAudience())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "the minted JWT-SVID does not parse: %v", err)
	}
	if svid.ID != id {
		return nil, status.Errorf(codes.Internal, "the minted JWT-SVID is for %s, not %s", svid.ID, id)
	}
	// ParseInsecure accepts a token whose audience merely overlaps the
	// requested one; a workload must get a token for exactly what it
	// asked, no audience more (it would be accepted there) or less.
	if !sameSet(svid.Audience, req.GetAudience()) {
		return nil, status.Errorf(codes.Internal, "the minted JWT-SVID is for audience %q, not the requested %q", svid.Audience, req.GetAudience())
	}
	return &workloadpb.JWTSVIDResponse{Svids: []*workloadpb.JWTSVID{{SpiffeId: id.String(), Svid: token}}}, nil
}

// mint asks the minter configured for a token of id.
func (s *Server) mint(ctx context.Context, id spiffeid.ID, audience []string) (string, error) {
	var token string
	var err error
	switch {
	case s.callerJWT != nil:
		token, err = s.callerJWT.MintJWTSVIDFor(ctx, id, audience)
	case s.jwt != nil:
		token, err = s.jwt.MintJWTSVID(ctx, audience)
	default:
		return "", status.Errorf(codes.Unavailable, "JWT-SVIDs are not available: %s", s.noJWT)
	}
	if err != nil {
		return "", MintStatus(err)
	}
	return token, nil
}

// CheckAudience refuses, with InvalidArgument, an audience list a
// JWT-SVID request must not carry: none, too many, an empty or oversized
// one, or one with a control character.
func CheckAudience(aud []string) error {
	switch {
	case len(aud) == 0:
		return status.Error(codes.InvalidArgument, "audience must be specified")
	case len(aud) > maxAudiences:
		return status.Errorf(codes.InvalidArgument, "%d audiences; at most %d are accepted", len(aud), maxAudiences)
	}
	for i, a := range aud {
		if a == "" || len(a) > maxAudienceSize {
			return status.Errorf(codes.InvalidArgument, "audience %d: want 1 to %d bytes, got %d", i+1, maxAudienceSize, len(a))
		}
		// An audience names a service; a control character in one is
		// never meant, and NUL or a newline would reach cache keys and
		// logs.
		if j := strings.IndexFunc(a, unicode.IsControl); j >= 0 {
			return status.Errorf(codes.InvalidArgument, "audience %d: control character %U at byte %d; an audience names a service (a URI or a name)", i+1, []rune(a[j:])[0], j)
		}
	}
	return nil
}

// sameSet reports whether a and b hold the same strings, order and
// repeats aside.
func sameSet(a, b []string) bool {
	in := func(s []string) map[string]bool {
		m := make(map[string]bool, len(s))
		for _, v := range s {
			m[v] = true
		}
		return m
	}
	return maps.Equal(in(a), in(b))
}

// MintStatus maps a minting failure to the status the workload gets: the
// upstream's code where it is about the request, Unavailable where it is
// about reaching or authenticating to the upstream.
func MintStatus(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return status.Errorf(codes.Unavailable, "minting the JWT-SVID: %v", err)
	}
	switch st.Code() {
	case codes.InvalidArgument, codes.PermissionDenied, codes.ResourceExhausted, codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return status.Errorf(st.Code(), "minting the JWT-SVID: %s", st.Message())
	}
	return status.Errorf(codes.Unavailable, "minting the JWT-SVID: %s: %s", st.Code(), st.Message())
}

// ValidateJWTSVID validates a JWT-SVID for an audience against the JWT
// authorities, among the caller's bundles, of the token's own trust
// domain (Workload API §6.3), as
// internal/jwtsvid.Validate does: alg none, HMAC, an unknown kid, an
// expired or not yet valid token and another audience are refused.
func (s *Server) ValidateJWTSVID(ctx context.Context, req *workloadpb.ValidateJWTSVIDRequest) (*workloadpb.ValidateJWTSVIDResponse, error) {
	switch {
	case req.GetAudience() == "":
		return nil, status.Error(codes.InvalidArgument, "audience must be specified")
	case req.GetSvid() == "":
		return nil, status.Error(codes.InvalidArgument, "svid must be specified")
	}
	if err := CheckAudience([]string{req.GetAudience()}); err != nil {
		return nil, err
	}
	sel, err := s.selectSource(ctx, "ValidateJWTSVID")
	if err != nil {
		return nil, err
	}
	defer sel.done()
	st, _ := sel.src.State()
	if st.SVID == nil {
		return nil, errNoIdentity
	}
	svid, err := jwtsvid.Validate(req.GetSvid(), jwtBundles(st), []string{req.GetAudience()}, nil)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	claims, err := structpb.NewStruct(svid.Claims)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "claims of a valid JWT-SVID: %v", err)
	}
	return &workloadpb.ValidateJWTSVIDResponse{SpiffeId: svid.ID.String(), Claims: claims}, nil
}

// jwtBundles is the JWT authorities of st, per trust domain.
func jwtBundles(st *State) *jwtbundle.Set {
	set := jwtbundle.NewSet()
	for _, b := range st.Bundles {
		set.Add(b.JWTBundle())
	}
	return set
}
