package caclient

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// JWTSVID is a JWT-SVID the identity service minted.
type JWTSVID struct {
	Token     string
	ID        spiffeid.ID
	ExpiresAt time.Time
}

// MintJWTSVID asks the identity service on conn (from Dial: beside the
// certificate service, on the same listener and with the same
// authentication) for a JWT-SVID for audience. ttl zero leaves the
// lifetime to the server, which clamps it to its maximum. A failed call
// returns the gRPC status error unwrapped. opts apply to the call (such
// as grpc.Peer, to tell a server's refusal from no connection).
func MintJWTSVID(ctx context.Context, conn grpc.ClientConnInterface, audience []string, ttl time.Duration, opts ...grpc.CallOption) (*JWTSVID, error) {
	if ttl < 0 {
		return nil, fmt.Errorf("lifetime %s is negative", ttl)
	}
	resp, err := identityapi.NewIdentityServiceClient(conn).MintJWTSVID(ctx, &identityapi.MintJWTSVIDRequest{
		Audience: audience, TtlSeconds: int64((ttl + time.Second - 1) / time.Second),
	}, opts...)
	if err != nil {
		return nil, err
	}
	id, err := spiffeid.FromString(resp.GetSpiffeId())
	if err != nil {
		return nil, fmt.Errorf("the server answered with an invalid spiffe_id: %w", err)
	}
	if resp.GetToken() == "" {
		return nil, errors.New("the server answered with an empty token")
	}
	return &JWTSVID{Token: resp.GetToken(), ID: id, ExpiresAt: time.Unix(resp.GetExpiresAt(), 0).UTC()}, nil
}

// Bundles is one message of the identity service's WatchBundles: what
// the caller may trust.
type Bundles struct {
	// Bundles are the trust domains' bundles, the caller's own included,
	// sorted by trust domain.
	Bundles []*spiffebundle.Bundle
	// Withheld are trust domains granted only for some peers, left out.
	Withheld []string
}

// JWTSource is the JWT authorities of b, per trust domain.
func (b *Bundles) JWTSource() jwtbundle.Source { return JWTSource(b.Bundles) }

// Limits of one WatchBundles message, which is untrusted input: the
// server is authenticated, but a bug or a compromise there must not make
// every agent allocate without bound.
const (
	// MaxBundleMapBytes bounds the message and the bundle map in it.
	MaxBundleMapBytes = 16 << 20
	// MaxTrustDomains bounds the trust domains of the bundle map, and
	// the withheld ones.
	MaxTrustDomains = 1024
)

// FetchBundles opens WatchBundles on conn (from Dial) and returns its
// first message: the caller's bundle map now, checked by
// ParseWatchBundles with local (zero: not checked).
func FetchBundles(ctx context.Context, conn grpc.ClientConnInterface, local spiffeid.TrustDomain) (*Bundles, error) {
	var first *Bundles
	err := WatchBundles(ctx, conn, local, func(b *Bundles, err error) error {
		if err != nil {
			return err
		}
		first = b
		return errStop
	})
	if errors.Is(err, errStop) {
		err = nil
	}
	return first, err
}

var errStop = errors.New("stop")

// WatchBundles streams the caller's bundles on conn (from Dial) to fn,
// one call per message the server sends (a new one only when what the
// caller may trust changed), until ctx ends, the stream fails, or fn
// returns an error, which WatchBundles returns. A message that
// ParseWatchBundles refuses (local: the caller's own trust domain, which
// must be in it; zero: not checked) reaches fn as (nil, err) and the
// stream goes on: the server sends a new message only when what the
// caller may trust changes, so a reconnect would fetch the same bad map
// again, while the caller keeps its last good bundles and counts the
// failure. A stream the server ends returns its gRPC status error:
// Unauthenticated when the credential that opened it expired,
// Unavailable when the server stops; reconnect.
func WatchBundles(ctx context.Context, conn grpc.ClientConnInterface, local spiffeid.TrustDomain, fn func(*Bundles, error) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := identityapi.NewIdentityServiceClient(conn).WatchBundles(ctx, &identityapi.WatchBundlesRequest{},
		grpc.MaxCallRecvMsgSize(MaxBundleMapBytes))
	if err != nil {
		return err
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		if err := fn(ParseWatchBundles(msg, local)); err != nil {
			return err
		}
	}
}

// ParseWatchBundles reads one WatchBundles message, untrusted input: a
// bundle map of at most MaxBundleMapBytes and MaxTrustDomains trust
// domains, holding local's bundle when local is not zero, and at most
// MaxTrustDomains withheld trust domains.
func ParseWatchBundles(msg *identityapi.WatchBundlesResponse, local spiffeid.TrustDomain) (*Bundles, error) {
	doc := msg.GetBundleMap()
	if len(doc) > MaxBundleMapBytes {
		return nil, fmt.Errorf("the server's bundle map is %d bytes; at most %d are accepted", len(doc), MaxBundleMapBytes)
	}
	bundles, _, err := bundledoc.ParseMap(doc)
	if err != nil {
		return nil, fmt.Errorf("the server's bundle map: %w", err)
	}
	if len(bundles) > MaxTrustDomains {
		return nil, fmt.Errorf("the server's bundle map has %d trust domains; at most %d are accepted", len(bundles), MaxTrustDomains)
	}
	if !local.IsZero() && !slices.ContainsFunc(bundles, func(b *spiffebundle.Bundle) bool { return b.TrustDomain() == local }) {
		return nil, fmt.Errorf("the server's bundle map is without the local trust domain %s, whose bundle it must always carry", local.Name())
	}
	withheld := msg.GetWithheldTrustDomains()
	if len(withheld) > MaxTrustDomains {
		return nil, fmt.Errorf("the server withheld %d trust domains; at most %d are accepted", len(withheld), MaxTrustDomains)
	}
	return &Bundles{Bundles: bundles, Withheld: withheld}, nil
}

// ParseBundles reads trust from a file's content: a SPIFFE bundle map, or
// one SPIFFE bundle (JWKS) of td, which must then be given.
func ParseBundles(doc []byte, td spiffeid.TrustDomain) ([]*spiffebundle.Bundle, error) {
	if bundledoc.IsMap(doc) {
		if !td.IsZero() {
			return nil, fmt.Errorf("a bundle map names its trust domains; --trust-domain %s applies to a single bundle only", td.Name())
		}
		bundles, _, err := bundledoc.ParseMap(doc)
		return bundles, err
	}
	if td.IsZero() {
		return nil, errors.New("not a SPIFFE bundle map; for a single bundle, say whose it is with --trust-domain")
	}
	b, _, err := bundledoc.Parse(td, doc)
	if err != nil {
		return nil, err
	}
	return []*spiffebundle.Bundle{b}, nil
}

// JWTSource is the JWT authorities of bundles, per trust domain: a token
// validates only against the bundle of its own trust domain.
func JWTSource(bundles []*spiffebundle.Bundle) jwtbundle.Source {
	set := jwtbundle.NewSet()
	for _, b := range bundles {
		set.Add(b.JWTBundle())
	}
	return set
}
