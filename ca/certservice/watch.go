package certservice

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/identityapi"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/loop"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// Defaults for Config's bundle streams.
const (
	// DefaultMaxBundleWatches bounds the WatchBundles streams open at once:
	// one per agent, each a goroutine and a copy of its bundle map.
	DefaultMaxBundleWatches = 10000
	// DefaultMaxBundleWatchesPerIdentity bounds the streams one identity
	// may hold, so that one caller cannot take every slot and lock out
	// every agent. An agent opens one stream, but every replica of a
	// Deployment or pod of a DaemonSet shares its service account's
	// identity: a cap of a handful would lock out the tenth replica. A
	// tenth of the global cap serves a thousand pods of one identity (and
	// their reconnects) while it takes ten identities to fill the server.
	DefaultMaxBundleWatchesPerIdentity = DefaultMaxBundleWatches / 10
	// DefaultWatchReauthInterval is how often a stream re-authenticates
	// its caller, as SDS does (sds.DefaultReauthInterval).
	DefaultWatchReauthInterval = 10 * time.Minute
	// reauthJitter spreads re-authentications over ±15% of the interval:
	// streams opened together (every agent reconnecting after a server
	// restart) would otherwise ask the authenticators, and the API
	// server behind them, all at once every interval.
	reauthJitter = 0.15
)

// WatchBundles streams the caller's bundle map, or that of the workload
// it acts for (impersonated_identity): at once, then whenever the trust or
// the decision changes what it holds. The stream ends with
// Unauthenticated when the credential that opened it expires or no
// longer authenticates, with PermissionDenied when the caller may no
// longer act for the workload, and with Unavailable when the server
// stops.
func (is *identityService) WatchBundles(req *identityapi.WatchBundlesRequest, stream grpc.ServerStreamingServer[identityapi.WatchBundlesResponse]) error {
	s := is.s
	ctx := stream.Context()
	w, release, ref := s.openWatch(ctx, authn.FromGRPC(ctx), req)
	if ref != nil {
		w.count(ref.code)
		return s.refuse(ctx, "bundle watch refused", w.r, w.ident, ref, w.logAttrs()...)
	}
	defer release()
	w.stream = stream
	w.reauthAt = w.nextReauth(s.timers().Now())
	ref, err := w.run(ctx)
	switch {
	case ref == nil:
		// The caller left, or the transport failed under the stream.
		w.count(codes.Canceled)
		if err == nil {
			err = status.FromContextError(ctx.Err()).Err()
		}
		return err
	case ref.reason == "shutdown":
		// Every stream ends at once: one log line for the server, not
		// one per stream.
		w.count(ref.code)
		return status.Error(ref.code, ref.msg)
	}
	w.count(ref.code)
	return s.refuse(ctx, "bundle watch ended", w.r, w.ident, ref, w.logAttrs()...)
}

// openWatch authenticates the caller, authorizes the workload it acts for
// if any, charges its rate limit like a signing and takes a stream slot.
// The watch it returns is set for the refusal's count and log too.
func (s *Service) openWatch(ctx context.Context, r authn.Request, req *identityapi.WatchBundlesRequest) (*watch, func(), *refusal) {
	w := &watch{s: s, r: r, impersonate: req.GetImpersonatedIdentity(), peerLimits: req.GetPeerLimits()}
	if s.cfg.Bundles == nil {
		return w, nil, &refusal{codes.FailedPrecondition, "not_configured", "this server does not stream bundles", nil}
	}
	var ref *refusal
	if w.ident, ref = s.authenticate(ctx, r, s.identityAuth); ref != nil {
		return w, nil, ref
	}
	if ref := w.authorize(ctx); ref != nil {
		return w, nil, ref
	}
	// As an impersonated signing: charged to the caller, which bounds a
	// node agent overall, and to the caller for the workload, so that
	// the workload's own pods elsewhere cannot spend the agent's budget.
	subject := w.subject().ID
	if !s.admission.allow(w.ident, subject) {
		return w, nil, &refusal{codes.ResourceExhausted, "rate_limited",
			fmt.Sprintf("rate limit of %v requests/s for %s exceeded; retry later", float64(s.cfg.RateLimit), w.ident.ID), nil}
	}
	// The slot is the workload's, not the caller's: one node agent
	// service account is every node's, so charging it would cap the
	// whole cluster's impersonated streams at MaxBundleWatchesPerIdentity,
	// while a workload's streams are bounded by its pods, as when each
	// pod watches for itself.
	if ref := s.takeWatchSlot(subject); ref != nil {
		return w, nil, ref
	}
	s.metrics.watchesOpen.Inc()
	return w, func() {
		s.releaseWatchSlot(subject)
		s.metrics.watchesOpen.Dec()
	}, nil
}

// watchSlots counts the open WatchBundles streams, in all and by caller.
type watchSlots struct {
	mu    sync.Mutex
	total int
	by    map[spiffeid.ID]int
}

// takeWatchSlot counts a stream for id, or refuses it when the server or
// id holds as many as it may.
func (s *Service) takeWatchSlot(id spiffeid.ID) *refusal {
	w := &s.watchSlots
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.total >= s.cfg.MaxBundleWatches:
		return &refusal{codes.ResourceExhausted, "too_many_streams",
			fmt.Sprintf("%d bundle streams are open, the most this server keeps; retry later", s.cfg.MaxBundleWatches), nil}
	case w.by[id] >= s.cfg.MaxBundleWatchesPerIdentity:
		return &refusal{codes.ResourceExhausted, "too_many_streams_per_identity",
			fmt.Sprintf("%s holds %d bundle streams, the most one identity may; close one or retry later", id, s.cfg.MaxBundleWatchesPerIdentity), nil}
	}
	if w.by == nil {
		w.by = make(map[spiffeid.ID]int)
	}
	w.total++
	w.by[id]++
	return nil
}

// releaseWatchSlot uncounts a stream of id; an identity with none left
// is forgotten, so the map holds only callers with open streams.
func (s *Service) releaseWatchSlot(id spiffeid.ID) {
	w := &s.watchSlots
	w.mu.Lock()
	defer w.mu.Unlock()
	w.total--
	if w.by[id]--; w.by[id] <= 0 {
		delete(w.by, id)
	}
}

// watch is one WatchBundles stream.
type watch struct {
	s      *Service
	stream grpc.ServerStreamingServer[identityapi.WatchBundlesResponse]
	r      authn.Request // what opened the stream, to re-authenticate
	// ident is the caller as last proved; its NotAfter, when set, ends
	// the stream.
	ident authn.Identity
	// impersonate is the request's impersonated_identity as sent, ""
	// for the caller's own trust; target is the workload it names once
	// authorized, re-authorized with every re-authentication.
	impersonate string
	target      spiffeid.ID
	// peerLimits sends peer-limited trust domains with their peers
	// rather than withholding them.
	peerLimits bool
	// reauthAt is when the caller is next proved again: fixed when the
	// stream opens and after each re-authentication, never by other
	// wake-ups, which trust or decision changes may bring more often
	// than the interval.
	reauthAt time.Time
	last     *identityapi.WatchBundlesResponse
}

// authorize decides whether the caller may have the trust of the
// workload it names, as for a certificate of it.
func (w *watch) authorize(ctx context.Context) *refusal {
	if w.impersonate == "" {
		return nil
	}
	target, ref := w.s.authorizeImpersonation(ctx, w.ident, watchImpersonation, w.impersonate)
	if ref != nil {
		return ref
	}
	w.target = target
	return nil
}

// subject is whose trust the stream carries (decisionSubject).
func (w *watch) subject() authn.Identity {
	if w.target.IsZero() {
		return w.ident
	}
	return decisionSubject(w.ident, w.target)
}

// count counts the stream's refusal or end with code, and once more
// among impersonated streams when it asked for a workload's trust.
func (w *watch) count(code codes.Code) {
	w.s.metrics.watches.WithLabelValues(code.String(), methodLabel(w.ident)).Inc()
	if w.impersonate != "" {
		w.s.metrics.impersonatedWatches.WithLabelValues(code.String()).Inc()
	}
}

// logAttrs are the stream's attributes beside the caller's: the workload
// it asked to act for.
func (w *watch) logAttrs() []any {
	if w.impersonate == "" {
		return nil
	}
	return []any{logattr.Impersonated, truncate(w.impersonate, 256)}
}

// run sends until the stream ends: a refusal, or none when the caller
// left (with the error of the send that found it gone, if any).
func (w *watch) run(ctx context.Context) (*refusal, error) {
	clk := w.s.timers()
	for {
		bundles, trustChanged := w.s.cfg.Bundles.Bundles()
		subject := w.subject()
		d, decisionChanged := w.s.decide(subject)
		shared, err := w.s.render(subject.ID.TrustDomain(), bundles, trustChanged, d, w.peerLimits)
		if err != nil {
			return &refusal{codes.Internal, "internal", "internal error", err}, nil
		}
		taints, taintChanged := w.s.taints()
		msg := withSPIFFEID(shared, subject.ID, w.s.cfg.JWTIssuer)
		w.s.withTaints(msg, subject.ID, taints)
		if w.last == nil || !sameMessage(w.last, msg) {
			if ref := w.s.checkSize(msg); ref != nil {
				return ref, nil
			}
			if err := w.stream.Send(msg); err != nil {
				return nil, err
			}
			w.last = msg
			w.s.metrics.watchMessages.Inc()
		}
		t := clk.NewTimer(w.untilCheck(clk.Now()))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil
		case <-w.s.stopping:
			t.Stop()
			return &refusal{codes.Unavailable, "shutdown", "the server is shutting down; reconnect", nil}, nil
		case <-trustChanged:
		case <-decisionChanged:
		case <-taintChanged:
		case <-t.C():
			if ref := w.check(ctx, clk.Now()); ref != nil {
				return ref, nil
			}
		}
		t.Stop()
	}
}

// checkSize refuses a message gRPC would not send (over the server's
// MaxSendMsgSize): the stream ends with the reason, counted and logged,
// where the failed send would look like a caller gone and the caller
// would reconnect to the same failure without a word.
func (s *Service) checkSize(msg *identityapi.WatchBundlesResponse) *refusal {
	n, limit := proto.Size(msg), s.maxWatchMessage.Load()
	if int64(n) <= limit {
		return nil
	}
	s.metrics.watchOversized.Inc()
	return &refusal{codes.ResourceExhausted, "message_too_large",
		fmt.Sprintf("your bundle map is %d bytes, over the %d this server sends; the trust policy must grant you fewer trust domains", n, limit),
		fmt.Errorf("bundle map of %d bytes (%d trust domains withheld, %d peer-limited) over the limit of %d", n, len(msg.GetWithheldTrustDomains()), len(msg.GetPeerLimits()), limit)}
}

// untilCheck is the wait until the credential expires or the next
// re-authentication, whichever comes first.
func (w *watch) untilCheck(now time.Time) time.Duration {
	d := w.reauthAt.Sub(now)
	if exp := w.ident.NotAfter; !exp.IsZero() {
		d = min(d, exp.Sub(now))
	}
	return max(d, 0)
}

// nextReauth is a jittered interval after now.
func (w *watch) nextReauth(now time.Time) time.Time {
	return now.Add(loop.Jitter(w.s.cfg.WatchReauthInterval, reauthJitter, (*w.s.rand.Load())()))
}

// check ends the stream once the credential has expired, and proves the
// caller again once its re-authentication is due, setting the next.
func (w *watch) check(ctx context.Context, now time.Time) *refusal {
	if exp := w.ident.NotAfter; now.Before(w.reauthAt) && (exp.IsZero() || now.Before(exp)) {
		return nil
	}
	if ref := w.reauthenticate(ctx, now); ref != nil {
		return ref
	}
	w.reauthAt = w.nextReauth(now)
	return nil
}

// reauthenticate ends the stream once the credential that opened it has
// expired, and otherwise proves the caller again with it, as SDS does, and
// authorizes again the workload it acts for: a revoked token or grant, or
// a pod gone from the caller's node, ends the stream within one interval.
// A backend that cannot decide ends it too (Unavailable): the caller
// reconnects and keeps its last bundles meanwhile.
func (w *watch) reauthenticate(ctx context.Context, now time.Time) *refusal {
	if exp := w.ident.NotAfter; !exp.IsZero() && !now.Before(exp) {
		return &refusal{codes.Unauthenticated, "credential_expired",
			fmt.Sprintf("the credential that opened this stream expired at %s; reconnect with a fresh one", exp.UTC().Format(time.RFC3339)), nil}
	}
	ident, ref := w.s.authenticate(ctx, w.r, w.s.identityAuth)
	if ref != nil {
		return ref
	}
	if ident.ID != w.ident.ID {
		return &refusal{codes.Unauthenticated, "identity_changed", "credentials no longer prove the identity that opened this stream; reconnect",
			fmt.Errorf("re-authentication proved %s, not %s", ident.ID, w.ident.ID)}
	}
	w.ident = ident
	// The workload may have left the caller's node since: asked again,
	// as a certificate would be.
	return w.authorize(ctx)
}

// decide is the caller's decision; without a Policy, everything.
func (s *Service) decide(ident authn.Identity) (trustpolicy.Decision, <-chan struct{}) {
	if s.cfg.Policy == nil {
		return trustpolicy.Decision{}, nil
	}
	return s.cfg.Policy.Decide(ident)
}

// timers is the clock streams wait on: Config.Clock when it has timers.
func (s *Service) timers() clock.Clock {
	if c, ok := s.cfg.Clock.(clock.Clock); ok {
		return c
	}
	return clock.RealClock{}
}

// stopWatches ends every bundle stream: the server is stopping, and a
// graceful stop would otherwise wait on streams that never end.
func (s *Service) stopWatches() {
	s.stopOnce.Do(func() { close(s.stopping) })
}

func sameMessage(a, b *identityapi.WatchBundlesResponse) bool {
	return bytes.Equal(a.GetBundleMap(), b.GetBundleMap()) && slices.Equal(a.GetWithheldTrustDomains(), b.GetWithheldTrustDomains()) &&
		a.GetSpiffeId() == b.GetSpiffeId() && a.GetJwtIssuer() == b.GetJwtIssuer() && sameTaints(a, b) &&
		slices.EqualFunc(a.GetPeerLimits(), b.GetPeerLimits(), func(x, y *identityapi.PeerLimit) bool {
			return x.GetTrustDomain() == y.GetTrustDomain() && slices.Equal(x.GetPeers(), y.GetPeers())
		})
}

// withSPIFFEID is the shared rendering msg for the stream of id, with
// the issuer of id's JWT-SVIDs: a new message with the same (never
// changed) contents, since the rendering is shared by every subject with
// the same decision.
func withSPIFFEID(msg *identityapi.WatchBundlesResponse, id spiffeid.ID, jwtIssuer string) *identityapi.WatchBundlesResponse {
	return &identityapi.WatchBundlesResponse{BundleMap: msg.GetBundleMap(), WithheldTrustDomains: msg.GetWithheldTrustDomains(),
		PeerLimits: msg.GetPeerLimits(), SpiffeId: id.String(), JwtIssuer: jwtIssuer}
}

// renderBundles is the message for a subject of trust domain local under
// d: the bundles allowedTrust keeps, and those it allows only for some
// peers, either with their peers (peerLimits) or withheld and named.
func renderBundles(local spiffeid.TrustDomain, bundles []*spiffebundle.Bundle, d trustpolicy.Decision, peerLimits bool) (*identityapi.WatchBundlesResponse, error) {
	keep, limited := allowedTrust(local, bundles, d)
	msg := &identityapi.WatchBundlesResponse{}
	for _, l := range limited {
		if !peerLimits {
			msg.WithheldTrustDomains = append(msg.WithheldTrustDomains, l.bundle.TrustDomain().Name())
			continue
		}
		keep = append(keep, l.bundle)
		msg.PeerLimits = append(msg.PeerLimits, peerLimit(l))
	}
	doc, err := bundledoc.MarshalMap(keep)
	if err != nil {
		return nil, err
	}
	msg.BundleMap = doc
	return msg, nil
}

// peerLimit is l on the wire: its peers as written, sorted, each once.
func peerLimit(l limitedTrust) *identityapi.PeerLimit {
	peers := make([]string, 0, len(l.peers))
	for _, p := range l.peers {
		peers = append(peers, p.String())
	}
	slices.Sort(peers)
	return &identityapi.PeerLimit{TrustDomain: l.bundle.TrustDomain().Name(), Peers: slices.Compact(peers)}
}

// limitedTrust is a trust domain a decision allows only for some peers.
type limitedTrust struct {
	bundle *spiffebundle.Bundle
	peers  []trustpolicy.Pattern
}

// allowedTrust is the trust a subject of trust domain local may have under
// d, for WatchBundles and for CreateCertificate's merged roots alike: its
// own bundle always and a federated one the decision allows to every
// member (keep), and, sorted by trust domain, those it allows only for
// some peers (limited), which neither a bundle map nor a list of roots
// can say: only a client told the peers can use them. Denied trust
// domains are absent.
func allowedTrust(local spiffeid.TrustDomain, bundles []*spiffebundle.Bundle, d trustpolicy.Decision) (keep []*spiffebundle.Bundle, limited []limitedTrust) {
	keep = make([]*spiffebundle.Bundle, 0, len(bundles))
	for _, b := range bundles {
		if b == nil {
			continue
		}
		td := b.TrustDomain()
		if td == local {
			keep = append(keep, b)
			continue
		}
		switch g, ok := d.Allows(td); {
		case !ok:
		case len(g.Peers) > 0:
			limited = append(limited, limitedTrust{bundle: b, peers: g.Peers})
		default:
			keep = append(keep, b)
		}
	}
	slices.SortFunc(limited, func(a, b limitedTrust) int {
		return strings.Compare(a.bundle.TrustDomain().Name(), b.bundle.TrustDomain().Name())
	})
	return keep, limited
}

// maxRenderings bounds the cache of renderings of one trust: one per
// distinct decision in use, which the policy's rules bound in practice.
const maxRenderings = 1024

// trustCache keeps what is rendered from the current trust (a
// WatchBundles message, a roots element) by key, so the callers with the
// same decision share one rendering per change. A trust is told apart
// from the last by its change channel and its slice.
type trustCache[V any] struct {
	mu      sync.Mutex
	changed <-chan struct{}
	first   *spiffebundle.Bundle
	n       int
	byKey   map[string]V
}

// get returns the rendering of key from bundles, made by build when the
// cache holds none for this trust.
func (c *trustCache[V]) get(bundles []*spiffebundle.Bundle, changed <-chan struct{}, key string, build func() (V, error)) (V, error) {
	var first *spiffebundle.Bundle
	if len(bundles) > 0 {
		first = bundles[0]
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byKey == nil || c.changed != changed || c.first != first || c.n != len(bundles) || len(c.byKey) >= maxRenderings {
		c.changed, c.first, c.n = changed, first, len(bundles)
		c.byKey = make(map[string]V)
	}
	if v, ok := c.byKey[key]; ok {
		return v, nil
	}
	v, err := build()
	if err != nil {
		return v, err
	}
	c.byKey[key] = v
	return v, nil
}

// render is renderBundles through the cache, keyed by the subject's trust
// domain and decision and whether peer limits were asked for: the two
// renderings of one decision differ when it limits peers.
func (s *Service) render(local spiffeid.TrustDomain, bundles []*spiffebundle.Bundle, changed <-chan struct{}, d trustpolicy.Decision, peerLimits bool) (*identityapi.WatchBundlesResponse, error) {
	key := local.Name() + "|" + d.Key() + "|" + strconv.FormatBool(peerLimits)
	return s.renderings.get(bundles, changed, key, func() (*identityapi.WatchBundlesResponse, error) {
		return renderBundles(local, bundles, d, peerLimits)
	})
}
