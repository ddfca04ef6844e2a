package certservice

import (
	"bytes"
	"context"
	"fmt"
	"slices"
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

// WatchBundles streams the caller's bundle map: at once, then whenever the
// trust or the caller's decision changes what it holds. The stream ends
// with Unauthenticated when the credential that opened it expires or no
// longer authenticates, and with Unavailable when the server stops.
func (is *identityService) WatchBundles(_ *identityapi.WatchBundlesRequest, stream grpc.ServerStreamingServer[identityapi.WatchBundlesResponse]) error {
	s := is.s
	ctx := stream.Context()
	r := authn.FromGRPC(ctx)
	ident, release, ref := s.openWatch(ctx, r)
	if ref != nil {
		s.metrics.watches.WithLabelValues(ref.code.String(), methodLabel(ident)).Inc()
		return s.refuse(ctx, "bundle watch refused", r, ident, ref)
	}
	defer release()
	w := &watch{s: s, stream: stream, r: r, ident: ident}
	w.reauthAt = w.nextReauth(s.timers().Now())
	ref, err := w.run(ctx)
	method := methodLabel(w.ident)
	switch {
	case ref == nil:
		// The caller left, or the transport failed under the stream.
		s.metrics.watches.WithLabelValues(codes.Canceled.String(), method).Inc()
		if err == nil {
			err = status.FromContextError(ctx.Err()).Err()
		}
		return err
	case ref.reason == "shutdown":
		// Every stream ends at once: one log line for the server, not
		// one per stream.
		s.metrics.watches.WithLabelValues(ref.code.String(), method).Inc()
		return status.Error(ref.code, ref.msg)
	}
	s.metrics.watches.WithLabelValues(ref.code.String(), method).Inc()
	return s.refuse(ctx, "bundle watch ended", r, w.ident, ref)
}

// openWatch authenticates the caller and takes a stream slot, charged to
// its rate limit like a signing.
func (s *Service) openWatch(ctx context.Context, r authn.Request) (authn.Identity, func(), *refusal) {
	if s.cfg.Bundles == nil {
		return authn.Identity{}, nil, &refusal{codes.FailedPrecondition, "not_configured", "this server does not stream bundles", nil}
	}
	ident, ref := s.authenticate(ctx, r, s.identityAuth)
	if ref != nil {
		return ident, nil, ref
	}
	if !s.admission.allow(ident.ID, ident.ID) {
		return ident, nil, &refusal{codes.ResourceExhausted, "rate_limited",
			fmt.Sprintf("rate limit of %v requests/s for %s exceeded; retry later", float64(s.cfg.RateLimit), ident.ID), nil}
	}
	if ref := s.takeWatchSlot(ident.ID); ref != nil {
		return ident, nil, ref
	}
	s.metrics.watchesOpen.Inc()
	return ident, func() {
		s.releaseWatchSlot(ident.ID)
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
	// reauthAt is when the caller is next proved again: fixed when the
	// stream opens and after each re-authentication, never by other
	// wake-ups, which trust or decision changes may bring more often
	// than the interval.
	reauthAt time.Time
	last     *identityapi.WatchBundlesResponse
}

// run sends until the stream ends: a refusal, or none when the caller
// left (with the error of the send that found it gone, if any).
func (w *watch) run(ctx context.Context) (*refusal, error) {
	clk := w.s.timers()
	for {
		bundles, trustChanged := w.s.cfg.Bundles.Bundles()
		d, decisionChanged := w.s.decide(w.ident)
		msg, err := w.s.render(w.ident.ID.TrustDomain(), bundles, trustChanged, d)
		if err != nil {
			return &refusal{codes.Internal, "internal", "internal error", err}, nil
		}
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
		fmt.Errorf("bundle map of %d bytes (%d trust domains withheld) over the limit of %d", n, len(msg.GetWithheldTrustDomains()), limit)}
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
	return now.Add(jittered(w.s.cfg.WatchReauthInterval, (*w.s.rand.Load())()))
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

// jittered is d moved by up to ±reauthJitter of itself: r in [0, 1)
// picks where.
func jittered(d time.Duration, r float64) time.Duration {
	return time.Duration(float64(d) * (1 - reauthJitter + 2*reauthJitter*r))
}

// reauthenticate ends the stream once the credential that opened it has
// expired, and otherwise proves the caller again with it, as SDS does: a
// revoked token or grant ends the stream within one interval. A backend
// that cannot decide ends it too (Unavailable): the caller reconnects and
// keeps its last bundles meanwhile.
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
	return nil
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
	return bytes.Equal(a.GetBundleMap(), b.GetBundleMap()) && slices.Equal(a.GetWithheldTrustDomains(), b.GetWithheldTrustDomains())
}

// renderBundles is the message for a caller of trust domain local under
// d: the bundles allowedTrust keeps, and the names of those it withholds.
func renderBundles(local spiffeid.TrustDomain, bundles []*spiffebundle.Bundle, d trustpolicy.Decision) (*identityapi.WatchBundlesResponse, error) {
	keep, withheld := allowedTrust(local, bundles, d)
	doc, err := bundledoc.MarshalMap(keep)
	if err != nil {
		return nil, err
	}
	return &identityapi.WatchBundlesResponse{BundleMap: doc, WithheldTrustDomains: withheld}, nil
}

// allowedTrust is the trust a caller of trust domain local may have under
// d, for WatchBundles and for CreateCertificate's merged roots alike: its
// own bundle always, a federated one the decision allows to every member,
// and, sorted, the names of those it allows only for some peers, which
// neither a bundle map nor a list of roots can say. Denied trust domains
// are absent.
func allowedTrust(local spiffeid.TrustDomain, bundles []*spiffebundle.Bundle, d trustpolicy.Decision) (keep []*spiffebundle.Bundle, withheld []string) {
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
			withheld = append(withheld, td.Name())
		default:
			keep = append(keep, b)
		}
	}
	slices.Sort(withheld)
	return keep, withheld
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

// render is renderBundles through the cache, keyed by the caller's trust
// domain and decision.
func (s *Service) render(local spiffeid.TrustDomain, bundles []*spiffebundle.Bundle, changed <-chan struct{}, d trustpolicy.Decision) (*identityapi.WatchBundlesResponse, error) {
	return s.renderings.get(bundles, changed, local.Name()+"|"+d.Key(), func() (*identityapi.WatchBundlesResponse, error) {
		return renderBundles(local, bundles, d)
	})
}
