package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	brokerpb "github.com/spiffe/go-spiffe/v2/exp/proto/spiffe/broker"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	delegatedv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/agent/delegatedidentity/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
	wapi "github.com/trustbridge/trustbridge/sds/workload"
)

// Header is the metadata every SPIFFE Broker API call must carry with the
// value "true" (Broker Endpoint §3, against server-side request forgery).
const Header = "broker.spiffe.io"

// DefaultRecheckInterval is how often an open stream authorises its
// broker and resolves its workload again, besides whenever the workload's
// Gone channel closes: a broker no longer allowed, or a workload whose
// identity changed, reaches open streams within it.
const DefaultRecheckInterval = time.Minute

// DefaultMaxStreams bounds the streams open at once, over every broker
// connection: each holds a workload's identity (and a pidfd for a pid),
// and one per workload and API is what a broker needs; ten times SPIRE's
// agent's 1,000 identities leaves room for every API of every workload.
const DefaultMaxStreams = 10_000

// Refusal sentinels a Node wraps (besides ErrInvalidReference and
// authn.ErrUnavailable, which answers Unavailable).
var (
	// ErrNotFound: the referenced workload is not on this node (NotFound,
	// WORKLOAD_NOT_FOUND).
	ErrNotFound = errors.New("workload not found")
	// ErrNotEntitled: the workload exists but gets no identity
	// (PermissionDenied, WORKLOAD_NOT_ENTITLED).
	ErrNotEntitled = errors.New("workload not entitled")
	// ErrNotBroker: the caller may not broker (PermissionDenied).
	ErrNotBroker = errors.New("caller is not an authorised broker")
)

// Node is what the server needs of the node agent.
type Node interface {
	// IdentifyCaller attests the caller of the call whose context ctx is.
	IdentifyCaller(ctx context.Context) (Caller, error)
	// Resolve verifies that ref names a workload of this node, attests it
	// and holds its identity: the Workload's Release lets go.
	Resolve(ctx context.Context, ref Reference) (*Workload, error)
	// ResolveCaller is Resolve for the caller itself: the SPIRE
	// Delegated Identity API's bundle streams name no workload and carry
	// the trust of the broker's own identity.
	ResolveCaller(ctx context.Context) (*Workload, error)
}

// Workload is a resolved reference.
type Workload struct {
	// ID is the workload's identity, which Source's SVID carries.
	ID spiffeid.ID
	// Source is its identity and the bundles it may trust, as the
	// Workload API serves them. Workloads of one identity should share one
	// Source.
	Source wapi.Source
	// Gone, when non-nil, is closed when the reference must be resolved
	// again: its process exited, the node's pods changed.
	Gone <-chan struct{}
	// Name describes the workload as attested, for logs.
	Name string
	// Again, when set, resolves this workload again in place of the
	// Node's Resolve of its reference: a process named by pid must be
	// attested again as the same process (its pin), never as whichever
	// process holds the pid by then.
	Again func(ctx context.Context) (*Workload, error)
	// Release lets go of the identity; called once.
	Release func()
}

func (w *Workload) release() {
	if w != nil && w.Release != nil {
		w.Release()
		w.Release = nil
	}
}

// Config configures a Server.
type Config struct {
	// Node attests callers and workloads (required).
	Node Node
	// Policy says who may broker (required).
	Policy *Policy
	// JWT mints JWT-SVIDs for a workload's identity; nil answers
	// FetchJWTSVID with Unavailable.
	JWT wapi.CallerJWTMinter
	// RecheckInterval: DefaultRecheckInterval when zero.
	RecheckInterval time.Duration
	// MaxStreams bounds the streams open at once; a stream past it is
	// refused with ResourceExhausted. DefaultMaxStreams when zero.
	MaxStreams int
	// Clock times rechecks; default the real one.
	Clock clock.Clock
	// Logger gets the audit of every call, rate limited; nil discards.
	Logger *slog.Logger
	// Registerer gets the trustbridge_broker_* metrics; nil registers
	// nowhere.
	Registerer prometheus.Registerer
}

// Server serves the SPIFFE Broker API and SPIRE's Delegated Identity API
// for the workloads of one node.
type Server struct {
	cfg     Config
	metrics *metrics
	audit   *ratelimit.LogLimiter
	refuse  *ratelimit.LogLimiter

	brokerAPI    brokerAPI
	delegatedAPI delegatedAPI
	messages     messages
	open         atomic.Int64 // streams open now
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Node == nil:
		return nil, errors.New("broker: no node to resolve workloads on")
	case cfg.Policy == nil || len(cfg.Policy.rules) == 0:
		return nil, errors.New("broker: no broker is allowed: name each one, e.g. --broker-allow sa:istio-system/ztunnel")
	case cfg.RecheckInterval < 0:
		return nil, fmt.Errorf("broker: recheck interval %s is negative", cfg.RecheckInterval)
	case cfg.MaxStreams < 0:
		return nil, fmt.Errorf("broker: maximum streams %d is negative", cfg.MaxStreams)
	}
	if cfg.MaxStreams == 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	if cfg.RecheckInterval == 0 {
		cfg.RecheckInterval = DefaultRecheckInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	s := &Server{cfg: cfg, metrics: m, audit: ratelimit.NewDefaultLogLimiter(), refuse: ratelimit.NewDefaultLogLimiter()}
	s.brokerAPI.s, s.delegatedAPI.s = s, s
	return s, nil
}

// Register registers both APIs on gs, which must serve a unix socket with
// the credentials the Node's IdentifyCaller reads.
func (s *Server) Register(gs grpc.ServiceRegistrar) {
	brokerpb.RegisterAPIServer(gs, &s.brokerAPI)
	delegatedv1.RegisterDelegatedIdentityServer(gs, &s.delegatedAPI)
}

// The APIs, for metrics and logs.
const (
	apiBroker    = "spiffe_broker"
	apiDelegated = "spire_delegated_identity"
)

// call is one RPC being served: what it is and whom it is for.
type call struct {
	api, method string
	caller      Caller
	ref         string
}

// begin checks the Broker API's header and authorises the caller.
func (s *Server) begin(ctx context.Context, api, method string) (*call, error) {
	c := &call{api: api, method: method}
	if api == apiBroker {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get(Header); len(v) != 1 || v[0] != "true" {
			return c, status.Errorf(codes.InvalidArgument, "security header missing from request: set metadata %q to \"true\"", Header)
		}
	}
	if err := s.authorize(ctx, c); err != nil {
		return c, err
	}
	return c, nil
}

// authorize attests c's caller and checks it against the policy.
func (s *Server) authorize(ctx context.Context, c *call) error {
	caller, err := s.cfg.Node.IdentifyCaller(ctx)
	if err != nil {
		return s.status(ctx, c, fmt.Errorf("%w: the caller could not be attested: %w", ErrNotBroker, err))
	}
	c.caller = caller
	if _, ok := s.cfg.Policy.Allows(caller); !ok {
		return s.status(ctx, c, fmt.Errorf("%w: %s matches none of the broker rules (%s); an operator allows brokers with --broker-allow", ErrNotBroker, caller, s.cfg.Policy))
	}
	return nil
}

// end counts a call's outcome and logs a refusal; served calls are
// audited by served.
func (s *Server) end(ctx context.Context, c *call, w *Workload, err error) {
	code := status.Code(err)
	if code == codes.Canceled && ctx.Err() != nil {
		code = codes.OK // the broker closed its stream
	}
	s.metrics.requests.WithLabelValues(c.api, c.method, code.String()).Inc()
	if code == codes.OK {
		return
	}
	lvl := s.refuse.Level(slog.LevelWarn)
	if code == codes.Internal {
		lvl = slog.LevelError
	}
	attrs := append(c.attrs(w), "code", code.String(), logattr.Error, status.Convert(err).Message())
	s.cfg.Logger.Log(ctx, lvl, "broker call refused", attrs...)
}

// served audits a call served (a stream when it opens): by the broker's
// identity and the workload's.
func (s *Server) served(ctx context.Context, c *call, w *Workload) {
	s.cfg.Logger.Log(ctx, s.audit.Level(slog.LevelInfo), "broker call served", c.attrs(w)...)
}

func (c *call) attrs(w *Workload) []any {
	attrs := []any{"api", c.api, "method", c.method, "broker", c.caller.String()}
	if c.ref != "" {
		attrs = append(attrs, "reference", c.ref)
	}
	if w != nil {
		attrs = append(attrs, "workload", w.Name, logattr.SPIFFEID, w.ID.String())
	}
	return attrs
}

// status maps a refusal to the call's status with the Broker API's
// ErrorInfo (§4.8) where one applies.
func (s *Server) status(ctx context.Context, c *call, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	// Only a status made here or by the Node for the broker passes as it
	// is: one wrapped in a refusal (the certificate service's answer to
	// the node) is mapped by the refusal's sentinel, as §4.8 lists.
	if _, ok := err.(interface{ GRPCStatus() *status.Status }); ok {
		return err
	}
	var code codes.Code
	reason := ""
	switch {
	case errors.Is(err, ErrInvalidReference):
		code, reason = codes.InvalidArgument, "WORKLOAD_REFERENCE_INVALID"
	case errors.Is(err, authn.ErrUnavailable):
		code = codes.Unavailable
	case errors.Is(err, ErrNotBroker):
		code = codes.PermissionDenied
	case errors.Is(err, ErrNotFound):
		code, reason = codes.NotFound, "WORKLOAD_NOT_FOUND"
	default:
		code, reason = codes.PermissionDenied, "WORKLOAD_NOT_ENTITLED"
	}
	st := status.New(code, err.Error())
	if reason != "" && c.api == apiBroker {
		info := &errdetails.ErrorInfo{Reason: reason, Domain: "spiffe.io"}
		if c.ref != "" {
			info.Metadata = map[string]string{"reference": c.ref}
		}
		if d, derr := st.WithDetails(info); derr == nil {
			st = d
		}
	}
	return st.Err()
}

// resolve resolves ref for c (ref nil: the caller itself).
func (s *Server) resolve(ctx context.Context, c *call, ref *Reference) (*Workload, error) {
	var w *Workload
	var err error
	if ref == nil {
		w, err = s.cfg.Node.ResolveCaller(ctx)
	} else {
		w, err = s.cfg.Node.Resolve(ctx, *ref)
	}
	if err != nil {
		return nil, s.status(ctx, c, err)
	}
	if w == nil || w.Source == nil {
		w.release()
		return nil, status.Error(codes.Internal, "broker: the node resolved the workload to nothing")
	}
	return w, nil
}

// outbox is what a stream last sent, and the shared message it holds.
type outbox struct {
	s     *Server
	c     *call
	build builder
	send  func(proto.Message) error
	last  proto.Message
	held  *message
}

// push sends w's message for st unless it is the one last sent.
func (o *outbox) push(ctx context.Context, w *Workload, st *wapi.State) error {
	e := o.s.messages.acquire(messageKey{state: st, api: o.c.api, method: o.c.method, id: w.ID})
	o.s.messages.release(o.held)
	o.held = e
	msg, err := e.get(o.build, w, st)
	if _, refusal := err.(interface{ GRPCStatus() *status.Status }); err != nil && !refusal {
		// Ours: a message that could not be built.
		o.s.cfg.Logger.Error("cannot build a broker message", append(o.c.attrs(w), logattr.Error, err.Error())...)
		return status.Error(codes.Internal, "broker: the workload's message could not be built")
	}
	if err != nil {
		return err
	}
	if msg == nil || msg == o.last || (o.last != nil && proto.Equal(msg, o.last)) {
		return nil
	}
	if err := o.send(msg); err != nil {
		return err
	}
	o.last = msg
	o.s.metrics.pushes.WithLabelValues(o.c.api, o.c.method).Inc()
	return nil
}

func (o *outbox) close() { o.s.messages.release(o.held) }

// again resolves w, which ref named, again: through w.Again when it has
// one.
func (s *Server) again(ctx context.Context, c *call, ref *Reference, w *Workload) (*Workload, error) {
	if w.Again == nil {
		return s.resolve(ctx, c, ref)
	}
	next, err := w.Again(ctx)
	if err != nil {
		return nil, s.status(ctx, c, err)
	}
	if next == nil || next.Source == nil {
		next.release()
		return nil, status.Error(codes.Internal, "broker: the node resolved the workload to nothing")
	}
	return next, nil
}

// builder makes a stream's next message from a workload's State; nil
// with no error sends nothing. Each method has one, which reads of w only
// its ID (and its Name, in a refusal): streams share what it makes from
// one State (messages).
type builder func(w *Workload, st *wapi.State) (proto.Message, error)

// stream serves one subscription: the first message at once, then one
// per change of what it carries, until the broker goes away, its
// workload is gone or it is no longer allowed to broker.
func (s *Server) stream(ctx context.Context, c *call, ref *Reference, build builder, send func(proto.Message) error) (err error) {
	var w *Workload
	defer func() {
		s.end(ctx, c, w, err)
		w.release()
	}()
	defer s.open.Add(-1)
	if n := s.open.Add(1); n > int64(s.cfg.MaxStreams) {
		return status.Errorf(codes.ResourceExhausted, "broker: %d streams are open, the most this agent serves at once; close streams of workloads that ended, or raise the bound", s.cfg.MaxStreams)
	}
	if w, err = s.resolve(ctx, c, ref); err != nil {
		return err
	}
	g := s.metrics.streams.WithLabelValues(c.api, c.method)
	g.Inc()
	defer g.Dec()
	s.served(ctx, c, w)
	recheck := s.cfg.Clock.NewTimer(s.cfg.RecheckInterval)
	defer recheck.Stop()
	gone := w.Gone
	out := &outbox{s: s, c: c, build: build, send: send}
	defer out.close()
	for {
		st, changed := w.Source.State()
		if err := out.push(ctx, w, st); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			continue
		case <-gone:
		case <-recheck.C():
			recheck.Reset(s.cfg.RecheckInterval)
		}
		next, err := s.recheck(ctx, c, ref, w)
		switch {
		case status.Code(err) == codes.Unavailable:
			// The node cannot decide now (its pods cannot be read): the
			// stream stays on what it last resolved, whose pin (pid,
			// pod UID) still holds, until the next recheck.
			gone = nil
			continue
		case err != nil:
			return err
		}
		w.release()
		w, gone = next, next.Gone
	}
}

// recheck authorises the broker again and resolves its workload again: a
// workload whose identity changed ends the stream, for the broker to
// subscribe again to what it is now.
func (s *Server) recheck(ctx context.Context, c *call, ref *Reference, w *Workload) (*Workload, error) {
	if err := s.authorize(ctx, c); err != nil {
		return nil, err
	}
	next, err := s.again(ctx, c, ref, w)
	if err != nil {
		return nil, err
	}
	if next.ID != w.ID {
		next.release()
		return nil, s.status(ctx, c, fmt.Errorf("%w: %s is now %s, no longer %s: subscribe again", ErrNotEntitled, w.Name, next.ID, w.ID))
	}
	return next, nil
}
