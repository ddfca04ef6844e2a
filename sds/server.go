package sds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
)

// minRefreshDelay is the shortest wait before a stream re-authenticates its
// caller and asks the credential source again, so that a source handing
// out credentials already due for refresh cannot make a stream spin.
const minRefreshDelay = 5 * time.Second

// DefaultReauthInterval is Config.ReauthInterval's default.
const DefaultReauthInterval = 10 * time.Minute

// Config configures a Server. TrustDomain, Trust and Authenticator are
// required.
type Config struct {
	// TrustDomain is the local trust domain: ROOTCA names its roots (see
	// RootCA), and callers must be members of it.
	TrustDomain spiffeid.TrustDomain
	// RootCA is what ROOTCA holds: RootCALocal (the zero value means it
	// too) the local roots, RootCASPIFFE what ALL holds for the caller.
	RootCA RootCAMode
	// Trust provides the roots of every trust domain.
	Trust TrustSource
	// Credentials provides the callers' certificates and keys; nil refuses
	// every tls_certificate resource with PermissionDenied.
	Credentials CredentialSource
	// Authenticator decides who the caller is, once per stream or Fetch
	// call, and again whenever a stream's credential is refreshed.
	Authenticator authn.Authenticator
	// ReauthInterval is how often a stream re-authenticates its caller
	// even when it holds no certificate that needs refreshing (a stream of
	// validation contexts only), so that revoking a token or letting a
	// client certificate expire ends the stream within this; default
	// DefaultReauthInterval.
	ReauthInterval time.Duration
	// Policy decides which trust domains (and which of their peers) each
	// caller may trust; nil trusts every trust domain, as before trust
	// policies. A stream decides when it opens, again when the policy's
	// channel fires and after every re-authentication, and pushes only
	// when the decision's effect (Decision.Key) changed.
	Policy AccessPolicy
	// Clock drives credential refreshes; nil means the real clock.
	Clock clock.Clock
	// Logger; nil discards.
	Logger *slog.Logger
	// Registerer receives the metrics; nil means a private registry.
	Registerer prometheus.Registerer
}

// Server implements Envoy's SecretDiscoveryService (v3): StreamSecrets
// (state of the world), DeltaSecrets (incremental) and FetchSecrets.
type Server struct {
	secretv3.UnimplementedSecretDiscoveryServiceServer

	cfg     Config
	metrics *metrics
	// nackLog bounds the NACK warnings: a bad push rejected by every
	// Envoy would otherwise log once per stream. The rest go to Debug;
	// the metric counts them all.
	nackLog *ratelimit.LogLimiter
	// refuseLog bounds the refusals a client can provoke (bad or
	// unverifiable credentials, a busy authenticator) and the
	// re-authentication retries, likewise.
	refuseLog   *ratelimit.LogLimiter
	validations *validationCache
	certs       *certCache
	empty       *Trust // stands in for a nil Trust

	// requestDone, when set (tests only), is called after a stream has
	// handled a request, so a test knows when to change the sources.
	requestDone func()
}

// New checks cfg and returns a Server. It starts nothing.
func New(cfg Config) (*Server, error) {
	if cfg.TrustDomain.IsZero() {
		return nil, errors.New("sds: no trust domain")
	}
	if cfg.Trust == nil {
		return nil, errors.New("sds: no trust source")
	}
	if cfg.Authenticator == nil {
		return nil, errors.New("sds: no authenticator")
	}
	if cfg.RootCA == "" {
		cfg.RootCA = RootCALocal
	}
	if _, err := ParseRootCAMode(string(cfg.RootCA)); err != nil {
		return nil, err
	}
	if cfg.ReauthInterval <= 0 {
		cfg.ReauthInterval = DefaultReauthInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("sds: %w", err)
	}
	return &Server{
		cfg:         cfg,
		metrics:     m,
		validations: newValidationCache(cfg.TrustDomain, cfg.Clock.Now, m.validation.Inc),
		certs:       &certCache{onEncode: m.cert.Inc, ids: make(map[spiffeid.ID]*certEntry)},
		empty:       &Trust{},
		nackLog:     ratelimit.NewDefaultLogLimiter(),
		refuseLog:   ratelimit.NewDefaultLogLimiter(),
	}, nil
}

// nackLevel is the level of a NACK's log line: Warn for about one a
// second (ten at once), Debug beyond.
func (s *Server) nackLevel() slog.Level {
	return s.nackLog.Level(slog.LevelWarn)
}

// Register adds SecretDiscoveryService (StreamSecrets, DeltaSecrets,
// FetchSecrets) to r.
func (s *Server) Register(r grpc.ServiceRegistrar) {
	secretv3.RegisterSecretDiscoveryServiceServer(r, s)
}

func (s *Server) handled() {
	if s.requestDone != nil {
		s.requestDone()
	}
}

// refusal ends a stream or call: the status returned to the client, and
// the reason logged.
type refusal struct {
	code   codes.Code
	reason string // log field, a fixed word
	msg    string // returned to the client; holds no internals
	err    error  // logged only
}

func (r *refusal) Error() string { return r.msg }

// serveStream authenticates a new stream of kind and runs it with the
// caller's identity, its saved request (for re-authentication) and the
// shared certificate entry of that identity; every exit is logged and
// counted by finish.
func (s *Server) serveStream(ctx context.Context, kind string,
	run func(ctx context.Context, s *Server, ident authn.Identity, r authn.Request, entry *certEntry) error) error {
	r := authn.FromGRPC(ctx)
	ident, ref := s.authenticate(ctx, r)
	if ref != nil {
		return s.finish(ctx, kind, r, ident, ref)
	}
	s.metrics.streams.WithLabelValues(kind).Inc()
	defer s.metrics.streams.WithLabelValues(kind).Dec()
	entry := s.certs.acquire(ident.ID)
	defer s.certs.release(ident.ID)
	return s.finish(ctx, kind, r, ident, run(ctx, s, ident, r, entry))
}

// authenticate decides who the caller of a stream or Fetch is.
func (s *Server) authenticate(ctx context.Context, r authn.Request) (authn.Identity, *refusal) {
	ident, err := s.cfg.Authenticator.Authenticate(ctx, r)
	if err == nil && ident.ID.IsZero() {
		err = errors.New("authenticator returned an empty identity")
	}
	if err != nil {
		s.metrics.authFails.Inc()
		if errors.Is(err, authn.ErrNotAttested) {
			// A process on the node agent's own node: the reason is its
			// operator's to read, and names nothing of another workload.
			if errors.Is(err, authn.ErrUnavailable) {
				return authn.Identity{}, &refusal{codes.Unavailable, "attestation_unavailable", err.Error(), err}
			}
			return authn.Identity{}, &refusal{codes.PermissionDenied, "not_attested", err.Error(), err}
		}
		if errors.Is(err, authn.ErrUnavailable) {
			return authn.Identity{}, &refusal{codes.Unavailable, "authn_unavailable", "authentication backend unavailable; retry later", err}
		}
		if errors.Is(err, authn.ErrPermissionDenied) {
			return authn.Identity{}, &refusal{codes.PermissionDenied, "token_claims_refused",
				"the token is valid, but its claims do not grant an identity under this server's issuer rules", err}
		}
		return authn.Identity{}, &refusal{codes.Unauthenticated, "unauthenticated",
			"no valid credentials: present an X509-SVID of this trust domain (mTLS) or a bearer token", err}
	}
	if !ident.ID.MemberOf(s.cfg.TrustDomain) {
		s.metrics.authFails.Inc()
		return ident, &refusal{codes.PermissionDenied, "foreign_trust_domain",
			fmt.Sprintf("%s is not a member of trust domain %s", ident.ID, s.cfg.TrustDomain.Name()), nil}
	}
	return ident, nil
}

// finish turns a handler's result into what gRPC returns, logging refusals
// the way the certificate service does.
func (s *Server) finish(ctx context.Context, kind string, r authn.Request, ident authn.Identity, err error) error {
	if err == nil {
		return nil
	}
	var ref *refusal
	if !errors.As(err, &ref) {
		// Transport errors (the client went away) and context ends.
		if st, ok := status.FromError(err); ok {
			return st.Err()
		}
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		return err
	}
	attrs := []any{"type", kind, "reason", ref.reason, "code", ref.code.String(), logattr.Address, r.Peer}
	if !ident.ID.IsZero() {
		attrs = append(attrs, logattr.SPIFFEID, ident.ID.String(), "method", ident.Method)
	}
	if ref.err != nil {
		attrs = append(attrs, logattr.Error, ref.err)
	}
	// A caller provokes refusals at will, and Unavailable is what a busy
	// authenticator answers to a flood: bounded lines, at Warn rather
	// than Error. Only an internal fault is ours, and always an Error.
	var lvl slog.Level
	switch ref.code {
	case codes.Internal:
		lvl = slog.LevelError
	case codes.Unavailable:
		lvl = s.refuseLog.Level(slog.LevelWarn)
	default:
		lvl = s.refuseLog.Level(slog.LevelInfo)
	}
	s.cfg.Logger.Log(ctx, lvl, "sds request refused", attrs...)
	return status.Error(ref.code, ref.msg)
}

// FetchSecrets returns the current resources of the names requested.
func (s *Server) FetchSecrets(ctx context.Context, req *discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryResponse, error) {
	r := authn.FromGRPC(ctx)
	ident, ref := s.authenticate(ctx, r)
	if ref != nil {
		return nil, s.finish(ctx, typeFetch, r, ident, ref)
	}
	ss := s.newSession(typeFetch, ident, r, req.GetNode(), nil)
	defer ss.stop()
	names := req.GetResourceNames()
	if ref := checkRequest(req.GetTypeUrl(), names); ref != nil {
		return nil, s.finish(ctx, typeFetch, r, ident, ref)
	}
	res, err := ss.resources(ctx, dedupSorted(names))
	if err != nil {
		return nil, s.finish(ctx, typeFetch, r, ident, err)
	}
	s.metrics.responses.WithLabelValues(typeFetch).Inc()
	return &discoveryv3.DiscoveryResponse{
		VersionInfo: versionOf(res),
		Resources:   anys(res),
		TypeUrl:     resourcev3.SecretType,
	}, nil
}

// checkRequest refuses another resource type and oversized subscriptions.
func checkRequest(typeURL string, names []string) *refusal {
	if typeURL != "" && typeURL != resourcev3.SecretType {
		return &refusal{codes.InvalidArgument, "type_url", fmt.Sprintf("type_url %q is not served here; only %s", typeURL, resourcev3.SecretType), nil}
	}
	if err := checkNames(names); err != nil {
		return &refusal{codes.InvalidArgument, "too_many_names", err.Error(), nil}
	}
	return nil
}

func anys(res []*encoded) []*anypb.Any {
	out := make([]*anypb.Any, len(res))
	for i, r := range res {
		out[i] = r.any
	}
	return out
}

func dedupSorted(names []string) []string {
	out := slices.Clone(names)
	slices.Sort(out)
	return slices.Compact(out)
}

// disablesSPIFFEValidation reports whether node asks for ALL (and ROOTCA
// under RootCASPIFFE) as a plain trusted_ca: DisableSPIFFEValidationKey set to true, or to a string
// strconv.ParseBool reads as true ("true", "True", "1"), as SPIRE's agent
// reads it. Anything else keeps the SPIFFE validator.
func disablesSPIFFEValidation(n *corev3.Node) bool {
	switch k := n.GetMetadata().GetFields()[DisableSPIFFEValidationKey].GetKind().(type) {
	case *structpb.Value_BoolValue:
		return k.BoolValue
	case *structpb.Value_StringValue:
		b, err := strconv.ParseBool(k.StringValue)
		return err == nil && b
	}
	return false
}
