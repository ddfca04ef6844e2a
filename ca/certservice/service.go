package certservice

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/identityapi"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
	"github.com/trustbridge/trustbridge/internal/workloaddns"
)

// Defaults for Config.
const (
	// DefaultQueueSize bounds the requests waiting for a signing slot:
	// a burst of 10,000 workloads asking at once (a node restart,
	// ztunnel attesting every pod) with a fifth to spare, even if none
	// were served while it arrives. A place costs the server about 13 KB
	// (its goroutine, gRPC's stream and the decoded request;
	// BenchmarkQueuedRequestMemory), so a full queue holds about 150 MiB,
	// which fits the 256 MiB memory limit of deploy/base and the chart
	// beside the process's own; 16384 would not leave room for it (see
	// docs/operations.md, "Sizing for bursts").
	DefaultQueueSize = 12288
	// DefaultQueueTimeout is the longest a request waits for a signing
	// slot: 8 times what 10,000 signings take on 2 cores (about 4,000 a
	// second), and under the 30 s trustbridge's agent gives a call, so
	// that it hears the server's answer (retry) rather than its own
	// deadline.
	DefaultQueueTimeout = 20 * time.Second
	// DefaultMaxRateLimiters bounds the per-identity limiters kept in
	// memory; the least recently used is forgotten first.
	DefaultMaxRateLimiters = 10000
	// faultLogEvery is how often a lasting fault of ours (the CA cannot
	// sign) is logged as an Error; the lines between go to Debug.
	faultLogEvery = 10 * time.Second
)

// Signer issues an X509-SVID from params: the key of the CSR the service
// parsed and judged, the identity the caller proved, the lifetime, the
// workload DNS names (Config.WorkloadDNSNames) and private extensions
// (the grant record). *ca.Authority implements it.
type Signer interface {
	SignX509SVID(params ca.X509SVIDParams) (*ca.Issued, error)
}

// SignerFunc adapts a function to Signer.
type SignerFunc func(params ca.X509SVIDParams) (*ca.Issued, error)

// SignX509SVID calls f.
func (f SignerFunc) SignX509SVID(params ca.X509SVIDParams) (*ca.Issued, error) {
	return f(params)
}

// Impersonator decides whether caller may obtain a certificate for target,
// another workload: Istio's ImpersonatedIdentity, which a node proxy
// (ztunnel) sends for the pods of its node. nodeauth.Authorizer implements
// it. An error wrapping authn.ErrUnavailable means the answer is not known
// yet; any other refuses.
type Impersonator interface {
	AuthorizeImpersonation(ctx context.Context, caller authn.Identity, target spiffeid.ID) error
}

// NameImpersonator is an Impersonator that may also grant the DNS names a
// node agent's CSR asks for on behalf of target: exactly dnsNames (sorted,
// each once), nil when they are exactly those the server's own identity
// map gives a running pod of the caller's node whose ID is target. Errors
// are those of AuthorizeImpersonation. An Impersonator that is not one
// grants no names: such a CSR is refused. nodeauth.Authorizer and
// nodeauth.Either implement it.
type NameImpersonator interface {
	AuthorizeImpersonationNames(ctx context.Context, caller authn.Identity, target spiffeid.ID, dnsNames []string) error
}

// Config configures a Service. Signer and Authenticator are required.
type Config struct {
	Signer        Signer
	Authenticator authn.Authenticator
	// MergedRoots hands out, after the roots that sign the leaf
	// (Issued.Roots), the X.509 roots of Bundles that the Policy
	// decision of the certificate's identity lets it trust, as one flat
	// list (the server's --ca-response-roots merged): see mergedRoots.
	// False hands out the signing roots only. It needs Bundles.
	MergedRoots bool
	// Impersonator, when set, lets the callers it authorizes ask for a
	// certificate of another identity (ImpersonatedIdentity); nil refuses
	// every such request.
	Impersonator Impersonator
	// Concurrency bounds the signings in flight (the CSR's signature
	// check and the signing, both CPU work); zero means GOMAXPROCS at
	// New. Raise it for a signer that waits rather than computes (an
	// HSM over the network).
	Concurrency int
	// QueueSize bounds the requests waiting, in arrival order, for one
	// of those: each takes a place per 4 KiB of request (one for a
	// typical CSR), so the largest CSRs fill it sooner and the queue's
	// memory stays bounded. When it is full a request is refused with
	// ResourceExhausted at once. Zero means DefaultQueueSize.
	QueueSize int
	// QueueTimeout bounds how long a request waits (the caller's
	// deadline may end it sooner); past it the request is refused with
	// ResourceExhausted. Zero means DefaultQueueTimeout.
	QueueTimeout time.Duration
	// RateLimit is the signings per second allowed to one authenticated
	// identity, with bursts of RateBurst; zero turns the limit off.
	RateLimit rate.Limit
	// RateBurst is the burst of the rate limit; zero means RateLimit rounded
	// up, at least 1.
	RateBurst int
	// MaxRateLimiters bounds the identities whose limiters are remembered;
	// zero means DefaultMaxRateLimiters.
	MaxRateLimiters int
	// Grants decides, by grant method (authn.MethodBootstrapToken,
	// authn.MethodKubernetesJWT), whether the credential that first granted
	// a renewing caller's identity still exists. A renewal whose grant has
	// no checker here is refused: the server no longer accepts that kind of
	// credential. See grantFor.
	Grants map[string]authn.GrantChecker
	// WorkloadDNSNames, when set, gives the certificates of Kubernetes
	// identities (a kubernetes-jwt or kubernetes-issuer grant, on a first
	// issuance or a renewal) a DNS SAN from this template beside the
	// SPIFFE ID (--workload-dns-name-template), which the Signer receives
	// in X509SVIDParams.DNSNames. Nil: no DNS names. A CSR asking for DNS
	// names is refused either way, unless an impersonating caller's
	// NameImpersonator grants them; the certificate then carries those
	// and the template's.
	WorkloadDNSNames *workloaddns.Template
	// MaxRenewalLifetime, when positive, refuses a renewal whose chain was
	// first granted longer ago than this, so every chain has to go back to
	// its bootstrap or service account token at least this often. Zero
	// means no bound. A chain can outlive it by one certificate lifetime.
	MaxRenewalLifetime time.Duration
	// DefaultTTL is the signer's lifetime for a request that names none
	// (validity_duration 0). It is needed only to shorten such a request
	// to a grant's bound (authn.GrantBounder); 0 then asks for exactly
	// the time left, which a signer whose maximum is shorter refuses.
	DefaultTTL time.Duration

	// Issued, when set, hears of every certificate CreateCertificate hands
	// out, with its caller: the server's ledger of what each authority
	// signed that is still in use. It must not block.
	Issued func(IssuedCertificate)
	// Authorized, when set, hears of every signing request (certificate,
	// JWT-SVID, intermediate) whose caller was authenticated, its grant
	// standing, its identity (or the one it acts for) authorized and the
	// request charged to its rate limit, with the call's context, before
	// it waits for a signing slot: the server confirms the caller's
	// connection then rather than after a wait in a burst. The request's
	// own checks (the CSR and the names it asks for) come after, in the
	// slot. A caller proven by a single-use credential is not reported:
	// a refused request leaves that credential unspent. It must not
	// block.
	Authorized func(ctx context.Context)

	// JWT, when set, mints JWT-SVIDs for callers of
	// trustbridge.identity.v1.IdentityService/MintJWTSVID(s); nil refuses
	// them (FailedPrecondition). The identity service is registered when
	// JWT or Bundles is set.
	JWT JWTSigner
	// JWTIssuer is the iss of the JWT-SVIDs JWT mints (ca.Config.JWTIssuer),
	// sent with every WatchBundles message so that clients validating
	// this trust domain's tokens can refuse another issuer's; "" for none.
	JWTIssuer string
	// Bundles, when set, is the trust WatchBundles streams, every trust
	// domain's bundle including the local one; nil refuses such streams.
	Bundles BundleSource
	// Policy filters what WatchBundles sends each caller, and, with
	// MergedRoots, the roots CreateCertificate hands out; nil sends every
	// trust domain.
	Policy AccessPolicy
	// Taints, when set, names the CA's tainted authorities in every
	// WatchBundles message to a caller of TrustDomain (of any trust
	// domain when TrustDomain is not set), so that clients re-issue what
	// they signed now; a change reaches every stream at once. Nil sends
	// none.
	Taints TaintSource
	// ReissueSpread is the window, sent with the taints, over which
	// clients spread that re-issuance (whole seconds, rounded up); zero
	// means DefaultReissueSpread. Negative is refused.
	ReissueSpread time.Duration
	// MaxBundleWatches bounds the WatchBundles streams open at once; zero
	// means DefaultMaxBundleWatches.
	MaxBundleWatches int
	// MaxBundleWatchesPerIdentity bounds those one identity holds; zero
	// means DefaultMaxBundleWatchesPerIdentity, or MaxBundleWatches when
	// that is smaller. Every pod of a Deployment or DaemonSet shares its
	// identity and opens one stream, so this must exceed the pods of the
	// largest one.
	MaxBundleWatchesPerIdentity int
	// WatchReauthInterval is how often a WatchBundles stream
	// re-authenticates its caller; zero means DefaultWatchReauthInterval.
	// A stream also ends when its caller's credential expires.
	WatchReauthInterval time.Duration

	// Intermediates, when set, signs downstream trustbridges'
	// intermediates (SignIntermediate) for the SPIFFE IDs in
	// DownstreamAllow (of TrustDomain, when that is set); an empty list
	// refuses every one.
	Intermediates   IntermediateSigner
	DownstreamAllow []spiffeid.ID
	TrustDomain     spiffeid.TrustDomain
	// MaxDownstreamTTL clamps an intermediate's lifetime; zero means
	// DefaultMaxDownstreamTTL.
	MaxDownstreamTTL time.Duration

	// Clock is the time; when it is a clock.Clock, WatchBundles' timers
	// run on it too.
	Clock      clock.PassiveClock
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Service implements securityv1alpha1.IstioCertificateServiceServer.
type Service struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer

	cfg       Config
	admission *admission
	metrics   *metrics
	policy    *authn.GrantPolicy
	// rootsElems are cert_chain's roots elements (rootsElement).
	rootsElems trustCache[string]
	// refuseLog bounds the "certificate request refused" lines of
	// callers that proved nothing; authedLog those of callers that did
	// (a revoked grant, a rate limit), so a flood of junk cannot push
	// those to Debug.
	refuseLog, authedLog *ratelimit.LogLimiter
	// faultLog bounds the Error lines of faults of ours that repeat on
	// every call until fixed; tests replace it.
	faultLog atomic.Pointer[ratelimit.LogLimiter]

	// identityAuth authenticates the identity service's callers
	// (identityAuthenticator).
	identityAuth authn.Authenticator
	watchSlots   watchSlots
	// maxWatchMessage is MaxBundleMessageSize; tests lower it.
	maxWatchMessage atomic.Int64
	// rand jitters re-authentication (math/rand/v2's Float64); tests
	// fix it.
	rand       atomic.Pointer[func() float64]
	renderings trustCache[*identityapi.WatchBundlesResponse]
	taintCache taintCache
	stopping   chan struct{} // closed by stopWatches
	stopOnce   sync.Once
}

// New checks cfg and returns a Service. It starts nothing.
func New(cfg Config) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("certservice: %w", err)
	}
	s := &Service{cfg: cfg, admission: newAdmission(cfg, m), metrics: m, refuseLog: ratelimit.NewDefaultLogLimiter(), authedLog: ratelimit.NewDefaultLogLimiter(),
		policy: &authn.GrantPolicy{Checkers: cfg.Grants, MaxLifetime: cfg.MaxRenewalLifetime, Clock: cfg.Clock}}
	s.stopping = make(chan struct{})
	s.maxWatchMessage.Store(MaxBundleMessageSize)
	s.faultLog.Store(ratelimit.NewLogLimiter(faultLogEvery, 1))
	s.rand.Store(ptr(rand.Float64))
	s.identityAuth = identityAuthenticator(cfg, s.policy)
	return s, nil
}

// validate refuses what no default can repair. It runs before
// withDefaults because zero means "default" there, so only what the
// caller set is judged; the checks keep their order so that a config
// with several faults names the same one first.
func (cfg Config) validate() error {
	if cfg.Signer == nil {
		return errors.New("certservice: no signer")
	}
	if cfg.Authenticator == nil {
		return errors.New("certservice: no authenticator")
	}
	if err := cfg.checkLimits(); err != nil {
		return err
	}
	if cfg.MergedRoots && cfg.Bundles == nil {
		return errors.New("certservice: merged roots need the trust of every trust domain (Bundles)")
	}
	if cfg.ReissueSpread < 0 {
		return fmt.Errorf("certservice: re-issue spread %s is negative; use 0 for the default of %s", cfg.ReissueSpread, DefaultReissueSpread)
	}
	if cfg.MaxRenewalLifetime < 0 {
		return fmt.Errorf("certservice: maximum renewal lifetime %s is negative", cfg.MaxRenewalLifetime)
	}
	if cfg.MaxDownstreamTTL < 0 {
		return fmt.Errorf("certservice: maximum downstream TTL %s is negative", cfg.MaxDownstreamTTL)
	}
	return checkDownstreamAllow(cfg.DownstreamAllow, cfg.TrustDomain)
}

// checkLimits refuses negative limits of admission and bundle streams.
func (cfg Config) checkLimits() error {
	// !(x >= 0) also refuses NaN, which a limiter treats as no limit.
	if cfg.QueueSize < 0 || !(cfg.RateLimit >= 0) || cfg.RateBurst < 0 || cfg.MaxRateLimiters < 0 {
		return fmt.Errorf("certservice: queue size (%d), rate limit (%v), burst (%d) and limiter count (%d) must not be negative or NaN",
			cfg.QueueSize, cfg.RateLimit, cfg.RateBurst, cfg.MaxRateLimiters)
	}
	if cfg.Concurrency < 0 || cfg.QueueTimeout < 0 {
		return fmt.Errorf("certservice: signing concurrency (%d) and queue timeout (%s) must not be negative", cfg.Concurrency, cfg.QueueTimeout)
	}
	if cfg.MaxBundleWatches < 0 || cfg.MaxBundleWatchesPerIdentity < 0 || cfg.WatchReauthInterval < 0 {
		return fmt.Errorf("certservice: bundle stream limits (%d, %d per identity) and re-authentication interval (%s) must not be negative",
			cfg.MaxBundleWatches, cfg.MaxBundleWatchesPerIdentity, cfg.WatchReauthInterval)
	}
	return nil
}

// withDefaults returns cfg with its zero values replaced by the
// documented defaults. It takes and returns a copy so the caller's
// Config is never changed behind its back.
func (cfg Config) withDefaults() Config {
	if cfg.MaxBundleWatches == 0 {
		cfg.MaxBundleWatches = DefaultMaxBundleWatches
	}
	// After MaxBundleWatches: the per-identity default never exceeds
	// the overall bound.
	if cfg.MaxBundleWatchesPerIdentity == 0 {
		cfg.MaxBundleWatchesPerIdentity = min(DefaultMaxBundleWatchesPerIdentity, cfg.MaxBundleWatches)
	}
	if cfg.WatchReauthInterval == 0 {
		cfg.WatchReauthInterval = DefaultWatchReauthInterval
	}
	if cfg.ReissueSpread == 0 {
		cfg.ReissueSpread = DefaultReissueSpread
	}
	if cfg.MaxDownstreamTTL == 0 {
		cfg.MaxDownstreamTTL = DefaultMaxDownstreamTTL
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = runtime.GOMAXPROCS(0)
	}
	if cfg.QueueTimeout == 0 {
		cfg.QueueTimeout = DefaultQueueTimeout
	}
	if cfg.MaxRateLimiters == 0 {
		cfg.MaxRateLimiters = DefaultMaxRateLimiters
	}
	if cfg.RateBurst == 0 {
		cfg.RateBurst = max(1, int(math.Ceil(float64(cfg.RateLimit))))
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
	return cfg
}

// Register adds the service to a gRPC server: Istio's certificate
// service, and trustbridge.identity.v1.IdentityService when Config.JWT
// or Config.Bundles is set.
func (s *Service) Register(r grpc.ServiceRegistrar) {
	securityv1alpha1.RegisterIstioCertificateServiceServer(r, s)
	if s.cfg.JWT != nil || s.cfg.Bundles != nil || s.cfg.Intermediates != nil {
		identityapi.RegisterIdentityServiceServer(r, &identityService{s: s})
	}
}

// impersonationKey is the request metadata field with which Istio's node
// proxies ask for another workload's identity. Unless an Impersonator
// authorizes it, such a request is refused rather than quietly answered
// with the caller's own identity: we never sign an identity the caller
// did not prove, and a node proxy proves its node through its pod.
const impersonationKey = "ImpersonatedIdentity"

// refusal is one way a request fails: the status returned to the client,
// and the reason logged and counted.
type refusal struct {
	code   codes.Code
	reason string // metric label and log field, a fixed word
	msg    string // returned to the client; holds no internals
	err    error  // logged only
}

// CreateCertificate authenticates the caller, checks the CSR against the
// proven identity, and signs it.
func (s *Service) CreateCertificate(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	return answer(ctx, s, s.metrics.requests, "certificate request refused", req, func(ctx context.Context, r authn.Request, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, authn.Identity, *refusal) {
		if proto.Size(req) > MaxRecvMsgSize {
			// The server's receive limit may be raised for services
			// sharing it (SDS); certificate requests keep theirs.
			return nil, authn.Identity{}, &refusal{codes.ResourceExhausted, "too_large", fmt.Sprintf("request larger than %d bytes", MaxRecvMsgSize), nil}
		}
		return s.create(ctx, r, req)
	})
}

// answer is the end of every unary RPC of the service: it runs handle
// for the caller, counts the outcome in counter by status code and how
// the caller proved its identity, and logs a refusal and returns it as
// the RPC's status (refused says what was refused).
func answer[Req, Resp any](ctx context.Context, s *Service, counter *prometheus.CounterVec, refused string, req Req,
	handle func(context.Context, authn.Request, Req) (Resp, authn.Identity, *refusal)) (Resp, error) {
	r := authn.FromGRPC(ctx)
	resp, ident, ref := handle(ctx, r, req)
	if ref != nil {
		counter.WithLabelValues(ref.code.String(), methodLabel(ident)).Inc()
		var none Resp
		return none, s.refuse(ctx, refused, r, ident, ref)
	}
	counter.WithLabelValues(codes.OK.String(), methodLabel(ident)).Inc()
	return resp, nil
}

// methodLabel is the metric label of how ident was proved, "none" when
// authentication failed.
func methodLabel(ident authn.Identity) string {
	if ident.Method == "" {
		return "none"
	}
	return ident.Method
}

// refuse logs a refusal, with extra attributes, and returns its status.
// Every RPC of the service logs its refusals here, so that all share the
// bounds below.
func (s *Service) refuse(ctx context.Context, msg string, r authn.Request, ident authn.Identity, ref *refusal, extra ...any) error {
	attrs := []any{"reason", ref.reason, "code", ref.code.String(), logattr.Address, r.Peer}
	if !ident.ID.IsZero() {
		attrs = append(attrs, logattr.SPIFFEID, ident.ID.String(), "method", ident.Method)
	}
	attrs = append(attrs, extra...)
	if ref.err != nil {
		attrs = append(attrs, logattr.Error, ref.err)
	}
	// A caller provokes refusals at will (bad credentials, limits, a
	// busy authenticator under a flood): a burst of lines at their
	// level, the rest at Debug, all counted by the metric. Only our own
	// faults are Errors on every call.
	lim := s.refuseLog
	if !ident.ID.IsZero() {
		lim = s.authedLog
	}
	var lvl slog.Level
	switch {
	case ref.code == codes.Internal:
		lvl = slog.LevelError
	case ref.reason == "signing_material" || ref.reason == "message_too_large":
		// Our fault, but one that lasts and repeats on every call (a CA
		// without a key, a map too large for a caller that reconnects):
		// an Error line an interval says it, the metric counts them all.
		lvl = s.faultLog.Load().Level(slog.LevelError)
	case ref.code == codes.Unavailable:
		lvl = lim.Level(slog.LevelWarn)
	default:
		lvl = lim.Level(slog.LevelInfo)
	}
	s.cfg.Logger.Log(ctx, lvl, msg, attrs...)
	return status.Error(ref.code, ref.msg)
}

// authenticate proves who the caller is with auth: Config.Authenticator
// for certificates, the stricter identityAuth for the identity service.
func (s *Service) authenticate(ctx context.Context, r authn.Request, auth authn.Authenticator) (authn.Identity, *refusal) {
	ident, err := auth.Authenticate(ctx, r)
	if err == nil && ident.ID.IsZero() {
		err = errors.New("authenticator returned an empty identity")
	}
	if err != nil {
		// An authenticator that could not reach its backend might have
		// accepted the caller: a retry may succeed, so say so, even when
		// another authenticator found the same token invalid (a bootstrap
		// token list rejects every service account token).
		if errors.Is(err, authn.ErrUnavailable) {
			return authn.Identity{}, &refusal{codes.Unavailable, "authn_unavailable", "authentication backend unavailable; retry later", err}
		}
		if errors.Is(err, authn.ErrPermissionDenied) {
			// A valid token whose identity its issuer's rules do not
			// allow: the reason (which rule) is logged, not sent.
			return authn.Identity{}, &refusal{codes.PermissionDenied, "token_claims_refused",
				"the token is valid, but its claims do not grant an identity under this server's issuer rules", err}
		}
		return authn.Identity{}, unauthenticated(err)
	}
	return ident, nil
}

// create is CreateCertificate for the caller r: authenticate, decide the
// certificate (certificatePlan), wait for a signing slot to judge the CSR
// and sign (signInTurn), spend a single-use credential, answer.
func (s *Service) create(ctx context.Context, r authn.Request, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, authn.Identity, *refusal) {
	ident, ref := s.authenticate(ctx, r, s.cfg.Authenticator)
	if ref != nil {
		return nil, ident, ref
	}
	p, ref := s.planCertificate(ctx, r, ident, req)
	if ref != nil {
		return nil, ident, ref
	}
	issued, dnsNames, ref := s.signInTurn(ctx, r, ident, p, req)
	if ref != nil {
		return nil, ident, ref
	}
	if ref := spend(ctx, ident, issued); ref != nil {
		return nil, ident, ref
	}
	resp := &securityv1alpha1.IstioCertificateResponse{CertChain: s.chainPEM(issued, p.id, s.rootsDecision(ident, p.id))}
	s.logIssued(r, ident, p, issued, dnsNames)
	s.recordIssued(r, ident, issued)
	return resp, ident, nil
}

// signInTurn waits for a signing slot, then parses and judges the CSR
// and signs it as p decided. Parsing checks the CSR's signature, which
// costs about as much as signing, so it is done in the slot too, and a
// request waiting its turn holds its CSR unparsed. The slot is
// given back before spend, which may wait on the token ledger's store.
func (s *Service) signInTurn(ctx context.Context, r authn.Request, ident authn.Identity, p certificatePlan, req *securityv1alpha1.IstioCertificateRequest) (*ca.Issued, []string, *refusal) {
	release, ref := s.admission.acquire(ctx, proto.Size(req), ident.Spend == nil)
	if ref != nil {
		return nil, nil, ref
	}
	defer release()
	csr, ref := parseCertificateCSR(req, p)
	if ref != nil {
		return nil, nil, ref
	}
	if p.dnsNames, ref = s.impersonatedDNSNames(ctx, ident, p, csr); ref != nil {
		return nil, nil, ref
	}
	return s.signCertificate(ctx, r, ident, p, csr)
}

// certificatePlan is what CreateCertificate decides before it takes a
// signing slot: the identity to certify, the lifetime, and the grant the
// certificate records; and, once the CSR is judged, the DNS names an
// impersonating caller was granted.
type certificatePlan struct {
	id           spiffeid.ID
	impersonated bool
	ttl          time.Duration
	grant        authn.Grant
	grantExt     pkix.Extension
	hasGrant     bool
	dnsNames     []string // granted by a NameImpersonator
}

// planCertificate decides the certificate for the authenticated ident:
// the identity (its own, or one it may impersonate), charged to its rate
// limit; the grant it records; the lifetime asked for, bounded by the
// grant.
func (s *Service) planCertificate(ctx context.Context, r authn.Request, ident authn.Identity, req *securityv1alpha1.IstioCertificateRequest) (certificatePlan, *refusal) {
	p := certificatePlan{id: ident.ID}
	if impersonates(req) {
		target, ref := s.impersonation(ctx, ident, req)
		if ref != nil {
			return p, ref
		}
		p.id, p.impersonated = target, true
	}
	if ref := s.admission.charge(ident, p.id); ref != nil {
		return p, ref
	}
	var ref *refusal
	if p.grantExt, p.grant, p.hasGrant, ref = s.grantFor(ctx, ident, r.Peer); ref != nil {
		return p, ref
	}
	if p.ttl, ref = validity("validity_duration", req.GetValidityDuration()); ref != nil {
		return p, ref
	}
	p.ttl, ref = s.boundTTL(p.ttl, p.id, p.grant, p.hasGrant)
	return p, ref
}

// parseCertificateCSR parses the request's CSR (its signature and key
// checked) and judges what it asks for against p, the one place that
// sees the CSR: the signer gets its key only, and a request for another
// identity must leave no trace but the refusal. DNS names of an
// impersonated request are left to impersonatedDNSNames.
func parseCertificateCSR(req *securityv1alpha1.IstioCertificateRequest, p certificatePlan) (*x509.CertificateRequest, *refusal) {
	csr, err := ca.ParseCSR([]byte(req.GetCsr()))
	if err != nil {
		return nil, &refusal{codes.InvalidArgument, "invalid_csr", clientMessage(err), nil}
	}
	if err := checkRequestedID(csr, p.id); err != nil {
		return nil, &refusal{codes.PermissionDenied, "identity_not_allowed", err.Error(), nil}
	}
	if msg := otherNames(csr, p.impersonated); msg != "" {
		return nil, &refusal{codes.InvalidArgument, "invalid_csr", msg, nil}
	}
	return csr, nil
}

// impersonatedDNSNames are the DNS names an impersonated request's CSR
// asks for, once the NameImpersonator confirmed that the server's own
// identity map gives exactly them to a pod of the caller's node with
// p.id: a node agent asks for the names its map gives the workload, and
// the server grants only what its map gives, never one pod's ID with
// another's names. The names compare as a set (sorted, each once).
func (s *Service) impersonatedDNSNames(ctx context.Context, caller authn.Identity, p certificatePlan, csr *x509.CertificateRequest) ([]string, *refusal) {
	if !p.impersonated || len(csr.DNSNames) == 0 {
		return nil, nil
	}
	names := slices.Compact(slices.Sorted(slices.Values(csr.DNSNames)))
	if len(names) > identitymap.MaxIdentityDNSNames {
		return nil, &refusal{codes.InvalidArgument, "invalid_csr", fmt.Sprintf(
			"the CSR requests %d DNS SANs; an identity map gives a workload at most %d", len(names), identitymap.MaxIdentityDNSNames), nil}
	}
	n, ok := s.cfg.Impersonator.(NameImpersonator)
	if !ok {
		return nil, &refusal{codes.PermissionDenied, "dns_names_not_allowed", fmt.Sprintf(
			"%s may not have a certificate for %s with DNS names %q: this server's node authorizer grants no DNS names (an identity map gives them); "+
				"drop the names of the workload's identity map rule, or give this server that identity map", caller.ID, p.id, names), nil}
	}
	if err := n.AuthorizeImpersonationNames(ctx, caller, p.id, names); err != nil {
		if errors.Is(err, authn.ErrUnavailable) {
			return nil, &refusal{codes.Unavailable, "impersonation_unavailable", "cannot decide on impersonation right now; retry later", err}
		}
		return nil, &refusal{codes.PermissionDenied, "dns_names_not_allowed",
			fmt.Sprintf("%s may not have a certificate for %s with DNS names %q: %v", caller.ID, p.id, names, err), err}
	}
	return names, nil
}

// signCertificate has csr's key signed as p decided, with the grant
// record and the workload DNS names (returned for the log), timing the
// signer; it refuses a signer's error or a result without the leaf
// first in its chain.
func (s *Service) signCertificate(ctx context.Context, r authn.Request, ident authn.Identity, p certificatePlan, csr *x509.CertificateRequest) (*ca.Issued, []string, *refusal) {
	var extra []pkix.Extension
	if p.hasGrant {
		extra = append(extra, p.grantExt)
	}
	dnsNames := unionNames(p.dnsNames, s.workloadDNSNames(ctx, ident, p.id, p.grant, p.hasGrant, r.Peer))
	start := s.cfg.Clock.Now()
	issued, err := s.cfg.Signer.SignX509SVID(ca.X509SVIDParams{PublicKey: csr.PublicKey, SPIFFEID: p.id, TTL: p.ttl, DNSNames: dnsNames, Extensions: extra})
	s.metrics.signDuration.Observe(s.cfg.Clock.Since(start).Seconds())
	if err != nil {
		return nil, nil, signRefusal(err)
	}
	if issued == nil || issued.Leaf == nil || len(issued.Chain) == 0 || issued.Chain[0] != issued.Leaf {
		return nil, nil, &refusal{codes.Internal, "internal", "internal error", errors.New("signer returned no leaf, or a chain not starting with it")}
	}
	return issued, dnsNames, nil
}

// IssuedCertificate is a certificate CreateCertificate handed out
// (Config.Issued).
type IssuedCertificate struct {
	Leaf *x509.Certificate
	// Caller is who asked: the workload, or a node agent asking for one.
	Caller authn.Identity
	// Presented is the X509-SVID the caller authenticated with (a
	// renewal), nil for a token: the certificate this one replaces when
	// both name the same workload.
	Presented *x509.Certificate
}

func (s *Service) recordIssued(r authn.Request, ident authn.Identity, issued *ca.Issued) {
	if s.cfg.Issued == nil {
		return
	}
	rec := IssuedCertificate{Leaf: issued.Leaf, Caller: ident}
	if ident.Method == authn.MethodX509SVID && len(r.PeerCertificates) > 0 {
		rec.Presented = r.PeerCertificates[0]
	}
	s.cfg.Issued(rec)
}

// logIssued logs a certificate issued to ident as p decided.
func (s *Service) logIssued(r authn.Request, ident authn.Identity, p certificatePlan, issued *ca.Issued, dnsNames []string) {
	if !s.cfg.Logger.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	// Typed attributes, one slice sized for the most a line carries: this
	// runs for every certificate.
	attrs := make([]slog.Attr, 0, 12)
	attrs = append(attrs, slog.String(logattr.SPIFFEID, p.id.String()), slog.String("method", ident.Method),
		slog.String("serial", issued.Leaf.SerialNumber.Text(16)), slog.String("not_after", issued.Leaf.NotAfter.UTC().Format(time.RFC3339)),
		slog.String(logattr.Address, r.Peer))
	if p.hasGrant {
		attrs = grantAttrs(attrs, p.grant)
	}
	if p.id != ident.ID {
		attrs = append(attrs, slog.String("impersonated_by", ident.ID.String()))
	}
	if len(dnsNames) > 0 {
		attrs = append(attrs, slog.Any(logattr.DNSNames, dnsNames))
	}
	s.cfg.Logger.LogAttrs(context.Background(), slog.LevelInfo, "certificate issued", attrs...)
}

// unauthenticated is the refusal of a caller no authenticator accepted.
// A bootstrap token that matched but was consumed or expired says so: only
// a holder of the real token learns it, and it tells them what to do.
func unauthenticated(err error) *refusal {
	switch {
	case errors.Is(err, authn.ErrTokenConsumed):
		return &refusal{codes.Unauthenticated, "token_consumed",
			"the bootstrap token was already used: it is single-use; ask for a new one (trustbridge token create), or renew with the certificate it bought (ca request --renew)", err}
	case errors.Is(err, authn.ErrTokenExpired):
		return &refusal{codes.Unauthenticated, "token_expired", "the bootstrap token expired; ask for a new one (trustbridge token create)", err}
	case errors.Is(err, authn.ErrNotIssuedHere):
		return &refusal{codes.Unauthenticated, "not_issued_here", notIssuedHereMessage, err}
	case errors.Is(err, authn.ErrSingleUse):
		return &refusal{codes.Unauthenticated, "token_single_use",
			"the bootstrap token is single-use: it buys one certificate (trustbridge ca request), which then authenticates here (mTLS); or mark its line reusable", err}
	}
	return &refusal{codes.Unauthenticated, "unauthenticated",
		"no valid credentials: present an X509-SVID of this trust domain (mTLS) or a bearer token", err}
}

// spend consumes a single-use credential (authn.Identity.Spend) once its
// certificate is signed: a request refused earlier, by a bad CSR or a
// limit, leaves the token usable. Of concurrent requests with one token,
// the one whose spending fails has its certificate withheld; the
// certificate, never sent, is as good as never issued.
func spend(ctx context.Context, ident authn.Identity, issued *ca.Issued) *refusal {
	if ident.Spend == nil {
		return nil
	}
	err := ident.Spend(ctx)
	if err == nil {
		return nil
	}
	err = fmt.Errorf("certificate %s withheld: %w", issued.Leaf.SerialNumber.Text(16), err)
	if errors.Is(err, authn.ErrUnavailable) {
		return &refusal{codes.Unavailable, "token_ledger_unavailable", "cannot record the bootstrap token as used right now; retry later", err}
	}
	return unauthenticated(err)
}

// impersonation judges a request for another identity, named by the
// request's ImpersonatedIdentity metadata (authorizeImpersonation). The
// certificate then carries the caller's grant, which names the caller's
// service account, so it can never be renewed as the impersonated
// workload: a node proxy asks again with its own token.
func (s *Service) impersonation(ctx context.Context, caller authn.Identity, req *securityv1alpha1.IstioCertificateRequest) (spiffeid.ID, *refusal) {
	v := req.GetMetadata().GetFields()[impersonationKey].GetStringValue()
	return s.authorizeImpersonation(ctx, caller, certificateImpersonation, v)
}

// impersonationAsk names, in refusals, what a caller asked to have of
// another workload and in which field.
type impersonationAsk struct {
	field string // where the target was named
	what  string // "<what> <target>" is what the caller may not have
}

var (
	certificateImpersonation = impersonationAsk{impersonationKey, "a certificate for"}
	watchImpersonation       = impersonationAsk{"impersonated_identity", "the bundles of"}
	jwtImpersonation         = impersonationAsk{"impersonated_identity", "a JWT-SVID for"}
)

// authorizeImpersonation judges a caller acting for the workload named by
// v, for a certificate or a bundle stream alike: only a caller the
// Impersonator authorizes, for a well-formed SPIFFE ID of a workload.
func (s *Service) authorizeImpersonation(ctx context.Context, caller authn.Identity, ask impersonationAsk, v string) (spiffeid.ID, *refusal) {
	if s.cfg.Impersonator == nil {
		return spiffeid.ID{}, &refusal{codes.PermissionDenied, "impersonation",
			"impersonation is not enabled on this server (--ca-trusted-node-accounts): certificates and bundles are for the authenticated identity only", nil}
	}
	// Whatever the Impersonator decides, a certificate must carry a
	// grant naming the caller's own token, which never renews it as the
	// workload; a certificate (whose grant may be legacy) or a token
	// without a grant could start a renewal chain of the workload's. A
	// bundle stream is held to the same rule: the trust of a workload is
	// for whoever may have its certificate.
	if caller.Method == authn.MethodX509SVID || caller.Grant == nil {
		return spiffeid.ID{}, &refusal{codes.PermissionDenied, "impersonation",
			"impersonation needs a caller authenticated by its own token (a node proxy's service account token), not a certificate", nil}
	}
	target, err := spiffeid.FromString(v)
	if err != nil || target.Path() == "" {
		return spiffeid.ID{}, &refusal{codes.InvalidArgument, "impersonation", fmt.Sprintf("%s %q is not a SPIFFE ID of a workload", ask.field, truncate(v, 256)), err}
	}
	// Whatever the Impersonator would say: a node acts for workloads of
	// its own trust domain only.
	if !target.MemberOf(caller.ID.TrustDomain()) {
		return spiffeid.ID{}, &refusal{codes.PermissionDenied, "impersonation",
			fmt.Sprintf("%s may not have %s %s: not of its trust domain %s", caller.ID, ask.what, target, caller.ID.TrustDomain().Name()), nil}
	}
	if err := s.cfg.Impersonator.AuthorizeImpersonation(ctx, caller, target); err != nil {
		if errors.Is(err, authn.ErrUnavailable) {
			return spiffeid.ID{}, &refusal{codes.Unavailable, "impersonation_unavailable", "cannot decide on impersonation right now; retry later", err}
		}
		return spiffeid.ID{}, &refusal{codes.PermissionDenied, "impersonation", fmt.Sprintf("%s may not have %s %s: %v", caller.ID, ask.what, target, err), err}
	}
	return target, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// impersonates reports whether the request carries Istio's impersonation
// field with any value but null or "": a list, a struct or a number asks
// for something too, and is refused rather than guessed at.
func impersonates(req *securityv1alpha1.IstioCertificateRequest) bool {
	v, ok := req.GetMetadata().GetFields()[impersonationKey]
	if !ok || v == nil {
		return false
	}
	switch k := v.GetKind().(type) {
	case nil, *structpb.Value_NullValue:
		return false
	case *structpb.Value_StringValue:
		return k.StringValue != ""
	}
	return true
}

// otherNames describes the names other than a SPIFFE ID that the CSR asks
// for, "" when there are none: only the SPIFFE ID the caller proved, and
// the DNS names the server decides, go in the certificate. The DNS names
// of an impersonated request are judged by impersonatedDNSNames.
func otherNames(csr *x509.CertificateRequest, impersonated bool) string {
	switch {
	case len(csr.DNSNames) > 0 && !impersonated:
		return fmt.Sprintf("the CSR requests %d DNS SANs; only the authenticated SPIFFE ID is issued", len(csr.DNSNames))
	case len(csr.IPAddresses) > 0:
		return fmt.Sprintf("the CSR requests %d IP SANs; only the authenticated SPIFFE ID is issued", len(csr.IPAddresses))
	case len(csr.EmailAddresses) > 0:
		return fmt.Sprintf("the CSR requests %d email SANs; only the authenticated SPIFFE ID is issued", len(csr.EmailAddresses))
	}
	return ""
}

// validity turns a lifetime in seconds (field names it: validity_duration,
// ttl_seconds) into a TTL for the signer:
// zero means the CA's default, and a value too large for a time.Duration
// is passed on as the largest one, for the signer to refuse as over its
// maximum.
func validity(field string, seconds int64) (time.Duration, *refusal) {
	switch {
	case seconds < 0:
		return 0, &refusal{codes.InvalidArgument, "invalid_ttl", fmt.Sprintf("%s %d is negative", field, seconds), nil}
	case seconds > int64(math.MaxInt64/time.Second):
		return time.Duration(math.MaxInt64), nil
	}
	return time.Duration(seconds) * time.Second, nil
}

// checkRequestedID refuses a CSR that names an identity other than id. A
// CSR without URI SANs is fine: the certificate carries id regardless.
func checkRequestedID(csr *x509.CertificateRequest, id spiffeid.ID) error {
	switch {
	case len(csr.URIs) > 1:
		return fmt.Errorf("the CSR requests %d URI SANs; at most one, the authenticated identity %s, may be requested", len(csr.URIs), id)
	case len(csr.URIs) == 1 && (csr.URIs[0] == nil || csr.URIs[0].String() != id.String()):
		return fmt.Errorf("the CSR requests a different identity than the authenticated %s", id)
	}
	return nil
}

// signRefusal maps the CA's sentinel errors. Anything else is a server
// fault whose details stay in the log.
func signRefusal(err error) *refusal {
	switch kind := ca.SignErrorKind(err); kind {
	case "invalid_csr", "invalid_ttl":
		return &refusal{codes.InvalidArgument, kind, clientMessage(err), nil}
	case "identity_not_allowed":
		return &refusal{codes.PermissionDenied, kind, clientMessage(err), nil}
	case "signing_material":
		return &refusal{codes.Unavailable, kind, "the CA cannot sign right now; retry later", err}
	}
	return &refusal{codes.Internal, "internal", "internal error", err}
}

// clientMessage is a CA error about the request itself, which is safe and
// useful to return: it describes the caller's own input.
func clientMessage(err error) string {
	return err.Error()
}

func ptr[T any](v T) *T { return &v }
