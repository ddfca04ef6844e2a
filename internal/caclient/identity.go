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
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
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
	return mintJWTSVID(ctx, conn, spiffeid.ID{}, audience, ttl, opts...)
}

// MintJWTSVIDFor is MintJWTSVID for workload rather than the caller: a
// node agent acting for a workload of its node, which the server grants
// as it grants that workload's certificate. A token whose subject is not
// exactly workload is refused: a server that predates the request field
// ignores it and signs the caller's own identity, which must not pass
// for the workload's.
func MintJWTSVIDFor(ctx context.Context, conn grpc.ClientConnInterface, workload spiffeid.ID, audience []string, ttl time.Duration, opts ...grpc.CallOption) (*JWTSVID, error) {
	if workload.IsZero() || workload.Path() == "" {
		return nil, fmt.Errorf("%q is not a SPIFFE ID of a workload", workload.String())
	}
	return mintJWTSVID(ctx, conn, workload, audience, ttl, opts...)
}

func mintJWTSVID(ctx context.Context, conn grpc.ClientConnInterface, workload spiffeid.ID, audience []string, ttl time.Duration, opts ...grpc.CallOption) (*JWTSVID, error) {
	req, err := mintRequest(workload, audience, ttl)
	if err != nil {
		return nil, err
	}
	return mintWith(ctx, conn, workload, req, opts...)
}

// mintWith makes req's MintJWTSVID call, for workload (zero: the
// caller's own).
func mintWith(ctx context.Context, conn grpc.ClientConnInterface, workload spiffeid.ID, req *identityapi.MintJWTSVIDRequest, opts ...grpc.CallOption) (*JWTSVID, error) {
	resp, err := identityapi.NewIdentityServiceClient(conn).MintJWTSVID(ctx, req, opts...)
	if err != nil {
		return nil, err
	}
	return checkMinted(workload, resp)
}

// mintRequest is the request for a JWT-SVID of workload (zero: the
// caller's own) for audience, lasting ttl (zero: the server's default).
func mintRequest(workload spiffeid.ID, audience []string, ttl time.Duration) (*identityapi.MintJWTSVIDRequest, error) {
	if ttl < 0 {
		return nil, fmt.Errorf("lifetime %s is negative", ttl)
	}
	req := &identityapi.MintJWTSVIDRequest{Audience: audience, TtlSeconds: int64((ttl + time.Second - 1) / time.Second)}
	if !workload.IsZero() {
		req.ImpersonatedIdentity = workload.String()
	}
	return req, nil
}

// checkMinted is the JWT-SVID the server answered a request for
// workload (zero: the caller's own) with, or why it cannot be used.
func checkMinted(workload spiffeid.ID, resp *identityapi.MintJWTSVIDResponse) (*JWTSVID, error) {
	id, err := spiffeid.FromString(resp.GetSpiffeId())
	if err != nil {
		return nil, fmt.Errorf("the server answered with an invalid spiffe_id: %w", err)
	}
	if !workload.IsZero() && id != workload {
		return nil, fmt.Errorf("the server minted a JWT-SVID for %s, not for %s: it is too old to mint for the workloads of a node agent", id, workload)
	}
	if resp.GetToken() == "" {
		return nil, errors.New("the server answered with an empty token")
	}
	return &JWTSVID{Token: resp.GetToken(), ID: id, ExpiresAt: time.Unix(resp.GetExpiresAt(), 0).UTC()}, nil
}

// Bundles is one message of the identity service's WatchBundles: what
// the caller, or the workload it watches for, may trust.
type Bundles struct {
	// ID is whose trust this is (the message's spiffe_id): the workload
	// of WatchOptions.Impersonate, else the caller. Zero when a server
	// that predates the field sends none.
	ID spiffeid.ID
	// Bundles are the trust domains' bundles, the caller's own included,
	// sorted by trust domain. With WatchOptions.PeerLimits they include
	// those of PeerLimits, which must then be trusted for those peers
	// only.
	Bundles []*spiffebundle.Bundle
	// Withheld are trust domains granted only for some peers, left out.
	Withheld []string
	// PeerLimits are, when WatchOptions.PeerLimits asked for them, the
	// trust domains of Bundles granted only for some peers, with the
	// trustpolicy.Pattern text of each peer trusted.
	PeerLimits map[spiffeid.TrustDomain][]string
	// JWTIssuer is the iss of the JWT-SVIDs of ID's trust domain (the
	// message's jwt_issuer), "" when they carry none or JWTIssuerErr is
	// set.
	JWTIssuer string
	// JWTIssuerErr says why the message's jwt_issuer was not taken. The
	// bundles still are: an optional check must not freeze trust updates
	// (a root rotation) over a field this client reads differently; the
	// caller keeps the issuer it had and says so.
	JWTIssuerErr error
	// Tainted are the signing authorities of ID's trust domain the
	// operator tainted (the message's tainted_authorities): credentials
	// they signed must be re-issued now, each at a random delay within
	// ReissueSpread. Entries TaintedErr names are left out.
	Tainted []TaintedAuthority
	// ReissueSpread is the window to spread that re-issuance over (0: at
	// once), at most MaxReissueSpread.
	ReissueSpread time.Duration
	// TaintedErr says which tainted authorities, or what of the spread,
	// were not taken. As with JWTIssuerErr, the bundles and the rest of
	// the taints still are.
	TaintedErr error
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
	// the withheld and the peer-limited ones.
	MaxTrustDomains = 1024
	// MaxPeers bounds the peers of every peer limit together: a rule
	// names a handful, and a workload is granted a few rules.
	MaxPeers = 4096
)

// WatchOptions are what a WatchBundles stream asks for beside the
// caller's own trust.
type WatchOptions struct {
	// Impersonate, when not zero, watches the trust of that workload
	// rather than the caller's: a node agent acting for a workload of its
	// node, as it obtains its certificate (Istio's ImpersonatedIdentity).
	// A message for anyone else is refused.
	Impersonate spiffeid.ID
	// PeerLimits asks for the trust domains granted only for some peers
	// with those peers (Bundles.PeerLimits) rather than withheld; the
	// caller must then enforce the limits.
	PeerLimits bool
}

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
	return WatchBundlesWith(ctx, conn, local, WatchOptions{}, fn)
}

// WatchBundlesWith is WatchBundles asking for opts, each message checked
// by ParseWatchBundlesWith. A stream for a workload (opts.Impersonate)
// also ends with PermissionDenied when the caller may not, or no longer
// may, act for it (its pod left the node).
func WatchBundlesWith(ctx context.Context, conn grpc.ClientConnInterface, local spiffeid.TrustDomain, opts WatchOptions, fn func(*Bundles, error) error) error {
	if id := opts.Impersonate; !id.IsZero() && id.Path() == "" {
		return fmt.Errorf("impersonated identity %s names a trust domain, not a workload", id)
	}
	req := &identityapi.WatchBundlesRequest{PeerLimits: opts.PeerLimits}
	if !opts.Impersonate.IsZero() {
		req.ImpersonatedIdentity = opts.Impersonate.String()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := identityapi.NewIdentityServiceClient(conn).WatchBundles(ctx, req, grpc.MaxCallRecvMsgSize(MaxBundleMapBytes))
	if err != nil {
		return err
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		if err := fn(ParseWatchBundlesWith(msg, local, opts)); err != nil {
			return err
		}
	}
}

// ParseWatchBundles reads one WatchBundles message, untrusted input: a
// bundle map of at most MaxBundleMapBytes and MaxTrustDomains trust
// domains, holding local's bundle when local is not zero, and at most
// MaxTrustDomains withheld trust domains. It is ParseWatchBundlesWith
// for a stream that asked for nothing more.
func ParseWatchBundles(msg *identityapi.WatchBundlesResponse, local spiffeid.TrustDomain) (*Bundles, error) {
	return ParseWatchBundlesWith(msg, local, WatchOptions{})
}

// ParseWatchBundlesWith reads one message of a stream that asked for
// opts, as ParseWatchBundles does, and its subject and peer limits: the
// spiffe_id, when set, a SPIFFE ID of local (when not zero), and exactly
// opts.Impersonate when that is set (a server that predates impersonated
// bundle watches ignores the request and sends the caller's own trust,
// which must not pass for the workload's); peer limits only when asked
// for (checkPeerLimits).
func ParseWatchBundlesWith(msg *identityapi.WatchBundlesResponse, local spiffeid.TrustDomain, opts WatchOptions) (*Bundles, error) {
	id, err := parseSubject(msg.GetSpiffeId(), local, opts.Impersonate)
	if err != nil {
		return nil, err
	}
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
	limits, err := checkPeerLimits(msg.GetPeerLimits(), bundles, local, opts.PeerLimits)
	if err != nil {
		return nil, err
	}
	out := &Bundles{ID: id, Bundles: bundles, Withheld: withheld, PeerLimits: limits, JWTIssuer: msg.GetJwtIssuer()}
	if out.JWTIssuer != "" {
		if _, err := jwtsvid.ParseIssuer(out.JWTIssuer); err != nil {
			out.JWTIssuer, out.JWTIssuerErr = "", fmt.Errorf("the server's JWT issuer: %w", err)
		}
	}
	out.Tainted, out.ReissueSpread, out.TaintedErr = parseTaints(msg)
	return out, nil
}

// parseSubject reads a message's spiffe_id: empty from an older server,
// which is fine unless the stream asked for the trust of impersonate.
func parseSubject(v string, local spiffeid.TrustDomain, impersonate spiffeid.ID) (spiffeid.ID, error) {
	if v == "" {
		if !impersonate.IsZero() {
			return spiffeid.ID{}, fmt.Errorf("the server names no subject for its bundles: it is too old for impersonated bundle watches "+
				"and may have sent the caller's own trust rather than %s's", impersonate)
		}
		return spiffeid.ID{}, nil
	}
	id, err := spiffeid.FromString(v)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("the server answered with an invalid spiffe_id: %w", err)
	}
	switch {
	case !impersonate.IsZero() && id != impersonate:
		return spiffeid.ID{}, fmt.Errorf("the server sent the bundles of %s, not of %s as asked", id, impersonate)
	case !local.IsZero() && !id.MemberOf(local):
		return spiffeid.ID{}, fmt.Errorf("the server sent the bundles of %s, not of a workload of the local trust domain %s", id, local.Name())
	}
	return id, nil
}

// checkPeerLimits reads the peer limits of a message, refused unless
// asked for: each of a trust domain of bundles but local, named once,
// with 1 or more peers, each a trustpolicy.Pattern of that trust domain,
// MaxPeers in all.
func checkPeerLimits(limits []*identityapi.PeerLimit, bundles []*spiffebundle.Bundle, local spiffeid.TrustDomain, asked bool) (map[spiffeid.TrustDomain][]string, error) {
	switch {
	case len(limits) == 0:
		return nil, nil
	case !asked:
		return nil, fmt.Errorf("the server sent peer limits of %d trust domains, which were not asked for", len(limits))
	case len(limits) > MaxTrustDomains:
		return nil, fmt.Errorf("the server sent peer limits of %d trust domains; at most %d are accepted", len(limits), MaxTrustDomains)
	}
	out := make(map[spiffeid.TrustDomain][]string, len(limits))
	total := 0
	for i, l := range limits {
		td, err := limitTrustDomain(l.GetTrustDomain(), bundles, local)
		if err == nil && out[td] != nil {
			err = errors.New("named twice")
		}
		if err == nil {
			total += len(l.GetPeers())
			err = checkPeers(l.GetPeers(), td, total)
		}
		if err != nil {
			return nil, fmt.Errorf("the server's peer limit %d (%q): %w", i, truncate(l.GetTrustDomain(), 256), err)
		}
		out[td] = slices.Clone(l.GetPeers())
	}
	return out, nil
}

// limitTrustDomain is the trust domain a peer limit names: one of
// bundles, not local, whose trust is never limited.
func limitTrustDomain(name string, bundles []*spiffebundle.Bundle, local spiffeid.TrustDomain) (spiffeid.TrustDomain, error) {
	td, err := spiffeid.TrustDomainFromString(name)
	switch {
	case err != nil:
		return td, err
	case td.Name() != name:
		return td, errors.New("not a trust domain name")
	case td == local:
		return td, errors.New("the local trust domain is trusted whole")
	case !slices.ContainsFunc(bundles, func(b *spiffebundle.Bundle) bool { return b.TrustDomain() == td }):
		return td, errors.New("its bundle is not in the bundle map")
	}
	return td, nil
}

// checkPeers refuses no peers, more than MaxPeers so far (total), or a
// peer that is not a pattern of td.
func checkPeers(peers []string, td spiffeid.TrustDomain, total int) error {
	switch {
	case len(peers) == 0:
		return errors.New("no peers")
	case total > MaxPeers:
		return fmt.Errorf("more than %d peers in all", MaxPeers)
	}
	for _, s := range peers {
		p, err := trustpolicy.ParsePattern(s)
		if err != nil {
			return err
		}
		if p.TrustDomain() != td {
			return fmt.Errorf("peer %q is not of that trust domain", s)
		}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
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
