package workload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
)

// Limits of the server. Requests are small (a JWT-SVID of at most
// jwtsvid.MaxTokenBytes is the largest field); a workload opens a few
// streams per connection.
const (
	maxRequestSize = 64 << 10
	// DefaultMaxConcurrentStreams is Config.MaxConcurrentStreams when 0.
	DefaultMaxConcurrentStreams = 100
)

// Header is the metadata key every Workload API call must carry with the
// value "true" (SPIFFE Workload Endpoint §6): a browser or a proxy that
// forwards requests to the socket cannot set it.
const Header = "workload.spiffe.io"

// Config configures a Server: Source serves one identity to every
// caller, Selector each caller its own; exactly one of them is set.
type Config struct {
	// Source gives what is served to every caller.
	Source Source
	// Selector gives what is served to each caller: it is asked for the
	// caller's Source on every stream and unary call, and again during a
	// stream (see ReselectInterval).
	Selector Selector
	// ReselectInterval is how often a stream asks the Selector again
	// even when its Source's State did not change, so that a caller whose
	// identity moved (a pod's service account changed, an identity map
	// rule was withdrawn) is served its new one, or refused, within this;
	// DefaultReselectInterval when 0. With a Selector only.
	ReselectInterval time.Duration
	// Clock drives the re-selections; nil means the real clock.
	Clock clock.Clock
	// Credentials are the gRPC server's transport credentials, such as
	// sds/attest's Attestor.Credentials, whose AuthInfo a Selector reads
	// from the call's context; nil serves without any, as a unix socket
	// whose file mode is the access control.
	Credentials credentials.TransportCredentials
	// JWT mints JWT-SVIDs for the one identity of Source; CallerJWT for
	// the identity it is given, the caller's own with a Selector. At most
	// one is set, and JWT not with a Selector. Without either
	// FetchJWTSVID is Unavailable, saying NoJWTReason.
	JWT         JWTMinter
	CallerJWT   CallerJWTMinter
	NoJWTReason string
	// JWTIssuer names, per trust domain, the issuer (iss) its JWT-SVIDs
	// carry: ValidateJWTSVID refuses a token whose iss names another.
	// nil, or "" for a trust domain, checks no iss.
	JWTIssuer jwtsvid.IssuerOf
	// MaxConcurrentStreams bounds the streams of one connection;
	// DefaultMaxConcurrentStreams when 0.
	MaxConcurrentStreams uint32
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Registerer receives the server's metrics; nil registers nowhere.
	Registerer prometheus.Registerer
}

// Server serves the SPIFFE Workload API, for the one identity its Source
// holds or for each caller the identity its Selector selects. Build it
// with New, run it with Serve.
type Server struct {
	workloadpb.UnimplementedSpiffeWorkloadAPIServer

	src        Source
	selector   Selector
	reselectIn time.Duration
	clock      clock.Clock
	creds      credentials.TransportCredentials
	jwt        JWTMinter
	callerJWT  CallerJWTMinter
	noJWT      string
	jwtIssuer  jwtsvid.IssuerOf
	maxStreams uint32
	log        *slog.Logger
	metrics    *metrics
	// refuseLog bounds the log lines of the Selector's refusals, which
	// any process that can open the socket provokes; the metric counts
	// them all.
	refuseLog *ratelimit.LogLimiter
	// ref is Source's reference encoding.
	ref encRef
}

// New checks cfg and applies its defaults; it starts nothing.
func New(cfg Config) (*Server, error) {
	if err := checkConfig(&cfg); err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	s := &Server{
		src:        cfg.Source,
		selector:   cfg.Selector,
		reselectIn: cfg.ReselectInterval,
		clock:      cfg.Clock,
		creds:      cfg.Credentials,
		jwt:        cfg.JWT,
		callerJWT:  cfg.CallerJWT,
		noJWT:      cfg.NoJWTReason,
		jwtIssuer:  cfg.JWTIssuer,
		maxStreams: cfg.MaxConcurrentStreams,
		log:        cfg.Logger,
		metrics:    m,
		refuseLog:  ratelimit.NewDefaultLogLimiter(),
	}
	if s.reselectIn <= 0 {
		s.reselectIn = DefaultReselectInterval
	}
	if s.clock == nil {
		s.clock = clock.RealClock{}
	}
	if s.maxStreams == 0 {
		s.maxStreams = DefaultMaxConcurrentStreams
	}
	if s.noJWT == "" {
		s.noJWT = "this server mints no JWT-SVIDs"
	}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return s, nil
}

// checkConfig refuses a Config that does not say whose identity is
// served, or whose JWT minter would mint for another identity than the
// caller's.
func checkConfig(cfg *Config) error {
	switch {
	case cfg.Source == nil && cfg.Selector == nil:
		return errors.New("no source: set Source to serve one identity to every caller, or Selector to serve each caller its own")
	case cfg.Source != nil && cfg.Selector != nil:
		return errors.New("both Source and Selector are set: Source serves one identity to every caller, Selector each caller its own; set one")
	case cfg.JWT != nil && cfg.CallerJWT != nil:
		return errors.New("both JWT and CallerJWT are set; set one")
	case cfg.JWT != nil && cfg.Selector != nil:
		return errors.New("JWT mints for one identity, and a Selector serves each caller its own: set CallerJWT instead")
	}
	return nil
}

// Serve serves the Workload API on ln until ctx is done, then stops
// (streams never end by themselves, so it does not wait for them) and
// returns nil; an error if serving fails first.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	opts := []grpc.ServerOption{
		grpc.ForceServerCodecV2(newCodec()),
		grpc.MaxRecvMsgSize(maxRequestSize),
		grpc.MaxConcurrentStreams(s.maxStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(s.unaryInterceptor),
		grpc.ChainStreamInterceptor(s.streamInterceptor),
	}
	if s.creds != nil {
		opts = append(opts, grpc.Creds(s.creds))
	}
	gs := grpc.NewServer(opts...)
	workloadpb.RegisterSpiffeWorkloadAPIServer(gs, s)
	done := make(chan error, 1)
	go func() { done <- gs.Serve(ln) }()
	if s.src != nil {
		// With a Selector there is no one State to watch: the Sources'
		// owner shows whether each is stale.
		wctx, stopWatch := context.WithCancel(ctx)
		watched := make(chan struct{})
		go func() { defer close(watched); s.watchStale(wctx) }()
		defer func() { stopWatch(); <-watched }()
	}
	select {
	case <-ctx.Done():
		gs.Stop()
		<-done
		return nil
	case err := <-done:
		if err == nil {
			err = errors.New("gRPC server stopped")
		}
		return fmt.Errorf("workload: serving: %w", err)
	}
}

// watchStale shows whether the State served is stale, in
// trustbridge_workload_api_stale and a log line when that changes, until
// ctx is done.
func (s *Server) watchStale(ctx context.Context) {
	var was error
	for {
		st, changed := s.src.State()
		switch {
		case st.Stale != nil && was == nil:
			s.metrics.stale.Set(1)
			s.log.Warn("the Workload API serves identity and bundles that may be out of date (the last good ones, or the first ones before their upstream answered)", logattr.Error, st.Stale.Error())
		case st.Stale == nil && was != nil:
			s.metrics.stale.Set(0)
			s.log.Info("the Workload API serves current identity and bundles again")
		}
		was = st.Stale
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// checkHeader refuses a call without the security header, as SPIRE does.
func checkHeader(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(Header); len(v) != 1 || v[0] != "true" {
		return status.Errorf(codes.InvalidArgument, "security header missing from request: set metadata %q to \"true\"", Header)
	}
	return nil
}

func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := func() (any, error) {
		if err := checkHeader(ctx); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}()
	s.metrics.requests.WithLabelValues(methodName(info.FullMethod), status.Code(err).String()).Inc()
	return resp, err
}

func (s *Server) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	method := methodName(info.FullMethod)
	err := checkHeader(ss.Context())
	if err == nil {
		g := s.metrics.streams.WithLabelValues(method)
		g.Inc()
		err = handler(srv, ss)
		g.Dec()
	}
	s.metrics.requests.WithLabelValues(method, status.Code(err).String()).Inc()
	return err
}

// methodName is the last element of a full gRPC method name.
func methodName(full string) string {
	for i := len(full) - 1; i >= 0; i-- {
		if full[i] == '/' {
			return full[i+1:]
		}
	}
	return full
}

// encoded returns st's responses as Config.Source's State.
func (s *Server) encoded(st *State) *encoded {
	return s.encodedFor(st, s.src, &s.ref)
}

// encodedFor returns st's responses, encoding them once per State
// whatever the number of streams asking and whether st is still current:
// a State published by a Cell keeps its encoding in its slot, so streams
// late to a State already replaced share it too, and so do the streams
// of every caller a Selector gave that Cell. src is the Source st came
// from, ref its reference encoding.
func (s *Server) encodedFor(st *State, src Source, ref *encRef) *encoded {
	slot := st.slot()
	if slot == nil {
		return s.encodedUnslotted(st, src, ref)
	}
	slot.once.Do(func() { slot.e = s.encode(st, slot.cell, &slot.cell.ref) })
	return slot.e
}

// encodedUnslotted serves a Source other than a Cell: the encoding of the
// current State is cached, one already replaced is encoded again per
// stream late to it.
func (s *Server) encodedUnslotted(st *State, src Source, ref *encRef) *encoded {
	if e := ref.last.Load(); e != nil && e.state == st {
		return e
	}
	return s.encode(st, src, ref)
}

// encode encodes st, sharing the frames equal to those of ref, the last
// encoding of a State of src that was current, and makes it ref while st
// is current.
func (s *Server) encode(st *State, src Source, ref *encRef) *encoded {
	ref.mu.Lock()
	defer ref.mu.Unlock()
	prev := ref.last.Load()
	if prev != nil && prev.state == st {
		return prev
	}
	e := encodeState(st, prev)
	s.metrics.encodings.Inc()
	// A State already replaced is not the reference for the next one:
	// frames are shared with the newest State's so that a stream moving
	// on compares against what it has.
	if cur, _ := src.State(); cur == st {
		ref.last.Store(e)
	}
	if e.encodingFailed != nil {
		s.log.Error("the Workload API cannot encode the current identity or bundles; streams are refused until it changes", logattr.Error, e.encodingFailed.Error())
	}
	return e
}

// watch sends pick's frame of the current State of the caller's Source on
// a stream at once and again whenever it changes, until the client goes
// away. With a Selector it selects the Source again on every change and
// every ReselectInterval, switching to another Source the moment the
// caller's identity moves and ending the stream when the caller is
// refused.
func (s *Server) watch(ss grpc.ServerStream, method string, pick func(*encoded) *frame) error {
	ctx := ss.Context()
	sel, err := s.selectSource(ctx, method)
	if err != nil {
		return err
	}
	defer func() { sel.done() }()
	tick, rearm := s.reselectTimer()
	defer rearm(false)
	pushes := s.metrics.pushes.WithLabelValues(method)
	var last *frame
	for {
		st, changed := sel.src.State()
		e := s.encodedFor(st, sel.src, sel.ref)
		if e.refusal != nil {
			return e.refusal
		}
		if e.encodingFailed != nil {
			return e.encodingFailed
		}
		if f := pick(e); f != last {
			if err := ss.SendMsg(f); err != nil {
				return err
			}
			pushes.Inc()
			last = f
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-changed:
		case <-tick:
			rearm(true)
		}
		if sel, err = s.reselect(ctx, method, sel); err != nil {
			return err
		}
	}
}

// reselectTimer is the channel on which a stream's re-selection is due,
// and the function that arms it again (true) or stops it (false); with
// one Source, nil (never due) and a no-op.
func (s *Server) reselectTimer() (<-chan time.Time, func(again bool)) {
	if s.selector == nil {
		return nil, func(bool) {}
	}
	t := s.clock.NewTimer(s.reselectIn)
	return t.C(), func(again bool) {
		if again {
			t.Reset(s.reselectIn)
		} else {
			t.Stop()
		}
	}
}

// FetchX509SVID streams the X509-SVID, its bundle and the federated
// bundles (Workload API §5.2).
func (s *Server) FetchX509SVID(_ *workloadpb.X509SVIDRequest, ss grpc.ServerStreamingServer[workloadpb.X509SVIDResponse]) error {
	return s.watch(ss, "FetchX509SVID", func(e *encoded) *frame { return e.x509SVID })
}

// FetchX509Bundles streams the X.509 bundles of every trust domain the
// workload may trust (Workload API §5.2).
func (s *Server) FetchX509Bundles(_ *workloadpb.X509BundlesRequest, ss grpc.ServerStreamingServer[workloadpb.X509BundlesResponse]) error {
	return s.watch(ss, "FetchX509Bundles", func(e *encoded) *frame { return e.x509Bundles })
}

// FetchJWTBundles streams the JWT bundles, as JWKS documents, of every
// trust domain the workload may trust that has JWT authorities
// (Workload API §6.2).
func (s *Server) FetchJWTBundles(_ *workloadpb.JWTBundlesRequest, ss grpc.ServerStreamingServer[workloadpb.JWTBundlesResponse]) error {
	return s.watch(ss, "FetchJWTBundles", func(e *encoded) *frame { return e.jwtBundles })
}
