package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/authn/oidc"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/identityapi"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/server/connlimit"
	"github.com/trustbridge/trustbridge/internal/server/nodeauth"
	"github.com/trustbridge/trustbridge/internal/workloaddns"
	"github.com/trustbridge/trustbridge/sds"
)

// Values of --ca-response-roots and --token-review.
const (
	RootsLocal  = "local"
	RootsMerged = "merged"

	tokenReviewAuto = "auto"
	TokenReviewOn   = "on"
	TokenReviewOff  = "off"
)

// GRPCServingPath is the path of the certificate service's own SPIFFE ID,
// spiffe://<trust-domain>/trustbridge/ca; `ca request` expects it.
const GRPCServingPath = ownPath + "/ca"

// ownPath is the path of the trust domain under which the server names its
// own identities (certificate service, bundle endpoint): the admin API
// mints none under it.
const ownPath = "/trustbridge"

// GRPCConfig configure the certificate service. Zero values mean the
// defaults, except listen: "" disables the service.
type GRPCConfig struct {
	// Downstream: intermediates signed for downstream trustbridges
	// (downstream.go).
	Downstream    DownstreamConfig
	Listen        string
	DNSNames      []string
	ResponseRoots string // "" = local
	tokenAudience string // "" = the trust domain name
	ClusterID     string // "" = any ClusterID metadata accepted
	// TrustedNodeAccounts may impersonate the pods of their node.
	TrustedNodeAccounts []string
	// NodeAgents are --ca-node-agent: node agents outside Kubernetes and
	// the identities each may impersonate.
	NodeAgents    []string
	BootstrapFile string
	rateLimit     float64
	queueSize     int // 0 = certservice.DefaultQueueSize
	// signConcurrency: 0 = GOMAXPROCS; queueTimeout: 0 =
	// certservice.DefaultQueueTimeout.
	signConcurrency int
	queueTimeout    time.Duration
	Kubeconfig      string // "" = in-cluster when KUBERNETES_SERVICE_HOST is set
	TokenReview     string // "" = auto
	// noSDSCerts turns off tls_certificate resources on SDS.
	noSDSCerts bool
	// WorkloadDNSNameTemplate: "" = no DNS names (workload_dns.go).
	WorkloadDNSNameTemplate string
	// MaxRenewalLifetime bounds renewal chains; 0 = no bound (grants.go).
	MaxRenewalLifetime time.Duration
	// tokenLedger opens where single-use bootstrap tokens are recorded as
	// consumed (the data directory, or a Secret with --storage kube); set
	// by runServer, no flag (tokens.go).
	tokenLedger func() (authn.TokenLedger, error)
	// access decides, per SDS caller, which trust domains and peers it
	// receives (the trust policy); nil gives every caller everything.
	access sds.AccessPolicy
	// identityMap, when set, is what node agents are granted from
	// (identitymap_setup.go); identityMapReady says its resources were read.
	identityMap      nodeauth.MapSource
	identityMapReady func() bool
	// jwtIssuer is --jwt-issuer, told to WatchBundles clients.
	jwtIssuer string
	// ledger hears of every certificate and JWT-SVID issued; nil: none.
	ledger *issuanceLedger
	// taints are the CA's tainted authorities WatchBundles sends, and
	// ReissueSpread the window clients spread their re-issues over.
	taints        *caTaints
	ReissueSpread time.Duration
	// Test hooks, no flags (grants.go).
	GrantHooks
	// TestJWT signs JWT-SVIDs in tests until the CA does (jwt_wiring.go).
	TestJWT certservice.JWTSigner
	// Bounds on unauthenticated work (authn_limits.go).
	authnLimits
	// OIDC and remote Kubernetes issuers (oidc_wiring.go).
	OIDC OIDCConfig
	// Conns bound the listener's connections, and a connection without
	// a successful call within firstCallTimeout (0: the default) is
	// closed (conn_limits.go).
	Conns            ConnLimits
	FirstCallTimeout time.Duration
}

func addGRPCFlags(f *pflag.FlagSet, o *GRPCConfig) {
	f.StringVar(&o.Listen, "grpc-listen", ":15012", `address of the certificate service (gRPC, Istio's IstioCertificateService, TLS) ("" disables it)`)
	f.StringSliceVar(&o.DNSNames, "grpc-dns-names", nil, "DNS names the certificate service's serving certificate carries next to spiffe://<trust-domain>"+GRPCServingPath+" (comma-separated), for clients that verify a host name, e.g. trustbridge.trustbridge-system.svc")
	f.StringVar(&o.ResponseRoots, "ca-response-roots", RootsLocal, "roots appended to issued chains: local (this trust domain's roots only), or merged (local roots first, then those of every federated trust domain the trust policy lets the certificate's workload trust, as for SDS and WatchBundles, leaving out one it limits to some peers, as one flat list: a client that cannot tell trust domains apart, such as an Istio sidecar, then trusts a peer's CA for this trust domain too; give federated trust per trust domain with SDS ALL or bundle.spiffe.json instead). trustbridge ca request and agent ignore these roots and fetch trust per trust domain")
	f.StringVar(&o.tokenAudience, "token-audience", "", "audience Kubernetes service account tokens must carry (default the trust domain name)")
	f.StringVar(&o.ClusterID, "cluster-id", "", `name of the Kubernetes cluster whose API server reviews tokens here, as Istio's CLUSTER_ID (istiod's default is "Kubernetes"): a caller whose ClusterID metadata names another cluster is refused before any review, as istiod does; "" accepts any ClusterID and lets the review decide`)
	f.StringVar(&o.BootstrapFile, "bootstrap-token-file", "", "file of bootstrap tokens for callers without Kubernetes or an SVID, one "+authn.TokenLineFormat+" per line, e.g. "+
		"TOKEN,spiffe://example.org/vm/laptop,expires=2026-12-01T10:00:00Z; add lines with trustbridge token create. "+
		"A token is single-use unless its line says reusable: it buys one certificate, which then renews itself, and is recorded as consumed "+
		"(by a digest, never the token) in --data-dir, or with --storage kube in --bootstrap-token-secret; consumed and expired tokens are refused (Unauthenticated). "+
		"Reloaded on change: replace it atomically, by writing a new file and renaming it over this one (token create does), since a reload that finds it truncated mid-write takes it as empty")
	f.Float64Var(&o.rateLimit, "sign-rate-limit", 0, "signings per second allowed to one authenticated identity, 0 for no limit (SPIRE caps at 500)")
	f.IntVar(&o.queueSize, "sign-queue-size", certservice.DefaultQueueSize, "signing requests (certificates, JWT-SVIDs, intermediates) that may wait, in arrival order, for one of the --sign-concurrency signing slots; "+
		"beyond them a request is refused at once (ResourceExhausted, reason queue_full) for the client to retry. A request takes a place per 4 KiB (one for a typical CSR; a batch of JWT-SVIDs waits once, for its whole size); "+
		"a place costs about 13 KB, so the default (a burst of 10,000 workloads asking at once, with room) holds about 150 MiB when full: raise it with the memory limit (docs/operations.md, Sizing for bursts)")
	f.IntVar(&o.signConcurrency, "sign-concurrency", 0, "signings in flight at once (the CSR's signature check and the signing, CPU work), 0 for GOMAXPROCS (the CPUs the server may use); "+
		"raise it for a signer that waits rather than computes (an HSM over the network)")
	f.DurationVar(&o.queueTimeout, "sign-queue-timeout", certservice.DefaultQueueTimeout, "longest a signing request waits for a signing slot (a shorter deadline of the caller ends it sooner); "+
		"then it is refused (ResourceExhausted, reason queue_timeout) for the client to retry. The default is 8 times what 10,000 signings take on 2 cores")
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file for the Kubernetes API (default: in-cluster config when KUBERNETES_SERVICE_HOST is set, else no Kubernetes)")
	f.StringVar(&o.TokenReview, "token-review", tokenReviewAuto, "authenticate Kubernetes service account tokens with TokenReview: auto (when a Kubernetes config is available), on, off")
	addGrantFlags(f, o)
	addImpersonationFlags(f, o)
	addListedAgentFlags(f, o)
	addWorkloadDNSFlags(f, o)
	addAuthnLimitFlags(f, &o.authnLimits)
	addOIDCFlags(f, &o.OIDC)
	addDownstreamFlags(f, &o.Downstream)
	grpcLimits.AddFlags(f, &o.Conns, "certificate service",
		"a Kubernetes node's pods behind one address (SNAT) or in one IPv6 /64 (a node's pod range): 250 pods, each with a sidecar and an agent connection", serverMemoryNote(grpcLimits))
	f.DurationVar(&o.FirstCallTimeout, "grpc-first-call-timeout", defaultFirstCallTimeout, "a connection to --grpc-listen on which no call has succeeded within this time of its accept is closed, whatever calls it made "+
		"(counted in trustbridge_listener_connections_unconfirmed_closed_total); one that has stays until idle for 15 min. Until then it may have 4 calls open "+
		"and counts against a quarter of --grpc-max-conns and half of --grpc-max-conns-per-source. The default covers the 10 s "+
		"TLS and HTTP/2 setup and a TokenReview; a client connects when it has a call to make, so a shorter one (e.g. 10s) refuses only the idle")
	f.DurationVar(&o.ReissueSpread, "reissue-spread", certservice.DefaultReissueSpread, "window over which agents spread the re-issue of the certificates and JWT-SVIDs "+
		"a tainted CA authority signed (trustbridge ca authority taint), each at a random point in it, so that 10,000 workloads do not "+
		"ask in one second (the certificate service signs a few thousand a second), from 1s (almost at once) to 24h. "+
		"Istio's own clients are not told and re-issue at their next renewal")
	f.Var(newInvertedBool(&o.noSDSCerts), "sds-workload-certs", "SDS (on --grpc-listen) also serves callers their own certificate (resource \"default\" or their SPIFFE ID) with a key generated here and sent over TLS; false: validation contexts only, and workloads get certificates from trustbridge agent, whose keys never leave the node")
}

// invertedBool is a bool flag whose zero value is true, so that the
// option's zero value is the default.
type invertedBool struct{ off *bool }

func newInvertedBool(off *bool) *invertedBool { return &invertedBool{off: off} }

func (b *invertedBool) String() string {
	if b.off != nil && *b.off {
		return "false"
	}
	return "true"
}

func (b *invertedBool) Set(v string) error {
	on, err := strconv.ParseBool(v)
	if err != nil {
		return err
	}
	*b.off = !on
	return nil
}

func (b *invertedBool) Type() string { return "bool" }

// IsBoolFlag lets --sds-workload-certs stand alone for true.
func (b *invertedBool) IsBoolFlag() bool { return true }

// grpcEndpoint is the wired certificate service and the SDS server
// sharing its listener.
type grpcEndpoint struct {
	ln       net.Listener
	id       spiffeid.ID
	roots    string
	methods  []string
	sdsCerts bool
	// dnsNames is --workload-dns-name-template, nil when off.
	dnsNames *workloaddns.Template
	runners  []func(context.Context) error
	grants   grantCheckers // by grant method; see grants.go
	// impersonator authorizes node proxies (impersonation.go); nil when
	// impersonation is off.
	impersonator certservice.Impersonator
	// tokens are the bootstrap tokens, nil without --bootstrap-token-file;
	// SIGHUP reloads them.
	tokens *authn.BootstrapTokens
	// oidc authenticates tokens of the --oidc-config issuers; nil without
	// any. Its status is served at /v1/authn/issuers.
	oidc *oidc.Authenticator
	// conns is ln, which closes connections on which no call has
	// succeeded in time; successful calls confirm theirs.
	conns *connlimit.Listener
}

// setupGRPC builds the certificate service and opens its listener; nil
// when --grpc-listen is "".
func setupGRPC(o GRPCConfig, td spiffeid.TrustDomain, workloadTTL, maxWorkloadTTL time.Duration, authority *ca.Authority,
	fed *federationSetup, reg prometheus.Registerer, logger *slog.Logger) (*grpcEndpoint, error) {
	if o.Listen == "" {
		return nil, checkGRPCOff(o)
	}
	logger = logger.With(logattr.Component, "ca-api")
	g := &grpcEndpoint{id: spiffeid.RequireFromPath(td, GRPCServingPath)}
	merged, err := g.responseRoots(o, td, logger)
	if err != nil {
		return nil, err
	}
	if err := checkGRPCFlags(o); err != nil {
		return nil, err
	}
	if g.dnsNames, err = workloadDNSNames(o, td); err != nil {
		return nil, err
	}
	chain, err := g.authenticators(o, td, authority, reg, logger)
	if err != nil {
		return nil, err
	}
	if err := g.addListedAgents(o, td, logger); err != nil {
		return nil, err
	}
	svc, err := g.certService(o, td, authority, fed, chain, merged, reg, logger)
	if err != nil {
		return nil, err
	}
	// Istio agents check the CA's host name; only this certificate has it
	// (workloadDNSNames reserves it). ca.New checked the names (naming
	// --grpc-dns-names); with no intermediate yet, handshakes fail.
	sc, err := authority.ServingCert(g.id, workloadTTL, ca.WithDNSNames(nonEmpty(o.DNSNames)...))
	if err != nil {
		return nil, err
	}
	sdsServer, err := g.sds(o, td, effectiveWorkloadTTL(workloadTTL, maxWorkloadTTL), authority, fed, g.confirming(g.sdsAuthenticator(chain, o)), reg, logger)
	if err != nil {
		return nil, err
	}
	firstCall := o.FirstCallTimeout
	if firstCall == 0 {
		firstCall = defaultFirstCallTimeout
	}
	// gRPC sets its keepalive timeout as the TCP user timeout only on a
	// *net.TCPConn, which the limits' wrapper hides from it.
	ln, err := grpcLimits.listenWith(o.Listen, o.Conns,
		connlimit.Config{ConfirmWithin: firstCall, PendingStreams: pendingStreams, TCPUserTimeout: certservice.KeepaliveTimeout}, reg, logger)
	if err != nil {
		return nil, err
	}
	g.ln, g.conns = ln, ln
	// SDS requests carry Envoy's node and may be far larger than a
	// certificate request; the certificate service bounds its own.
	srv := certservice.NewServer(svc, certservice.TLSConfig(sc.GetCertificate), ln, grpc.MaxRecvMsgSize(sds.MaxRequestSize),
		grpc.InTapHandle(g.admitCall), grpc.ChainUnaryInterceptor(g.confirmUnary), grpc.ChainStreamInterceptor(g.confirmStream))
	sdsServer.Register(srv.Registrar())
	o.reportServices(srv.Registrar())
	g.runners = append(g.runners, sc.Run, srv.Run)
	return g, nil
}

// pendingStreams is how many calls a connection to the certificate
// service may have open at once before one of its calls succeeds. Each
// open call holds a goroutine and buffers before anything is
// authenticated (128, gRPC's per-connection limit here, that send
// headers and no body cost about 2 MiB): without this bound, the
// connection limits would not bound memory. A workload's first call is
// one certificate request or one SDS or bundle stream; Envoy opens a few
// SDS streams at once.
const pendingStreams = 4

// A connection to the certificate service is confirmed (kept past
// --grpc-first-call-timeout, and let open more than pendingStreams calls)
// by a call that succeeded, or by a signing request as it starts to wait
// for a signing slot (certservice.Config.Authorized; a wait in a burst
// must not leave the connection's other calls refused): the caller was
// authenticated, its grant stands, the identity it asks for was
// authorised and charged to its rate limit. A call refused before that,
// however it failed, confirms nothing, so an unauthenticated client, or
// one holding a certificate whose grant fell, cannot keep a connection
// open by making calls; nor can a single-use token, whose requests
// confirm only by succeeding (which spends it).

// callDoneKey holds, in a call's context, the func that counts the call
// out of its connection's open calls (connlimit.OpenStream).
type callDoneKey struct{}

// admitCall is the listener's InTapHandle: it refuses a call beyond
// pendingStreams on a connection not yet confirmed, before gRPC spends a
// goroutine on it. The call is counted out when its handler returns
// (callDone, from the interceptors: before its status is written, so a
// client that makes its calls one after another never meets its own last
// one), or else when its context ends (a call no handler ran).
func (g *grpcEndpoint) admitCall(ctx context.Context, _ *tap.Info) (context.Context, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ctx, nil
	}
	done, ok := g.conns.OpenStream(p.Addr, p.LocalAddr)
	if !ok {
		return ctx, status.Errorf(codes.ResourceExhausted,
			"at most %d calls may be open at once on a connection before one of them succeeds; retry when one has ended", pendingStreams)
	}
	stop := context.AfterFunc(ctx, done)
	return context.WithValue(ctx, callDoneKey{}, func() { stop(); done() }), nil
}

// callDone counts ctx's call out of its connection's open calls.
func callDone(ctx context.Context) {
	if done, ok := ctx.Value(callDoneKey{}).(func()); ok {
		done()
	}
}

// confirm confirms the connection ctx's call came on.
func (g *grpcEndpoint) confirm(ctx context.Context) {
	if p, ok := peer.FromContext(ctx); ok {
		g.conns.Confirm(p.Addr, p.LocalAddr)
	}
}

// confirmUnary confirms a connection whose unary call (CreateCertificate,
// MintJWTSVID, SignIntermediate) succeeded.
func (g *grpcEndpoint) confirmUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	// A MintJWTSVIDs call succeeds even when every token it asked for
	// was refused (each carries its own status): it confirms as its
	// batch starts to wait for a signing slot (certservice's
	// Config.Authorized), which it does only with a token authorised
	// and charged.
	if err == nil && info.FullMethod != identityapi.IdentityService_MintJWTSVIDs_FullMethodName {
		g.confirm(ctx)
	}
	callDone(ctx)
	return resp, err
}

// confirmStream confirms a connection once a stream's first response is
// sent (WatchBundles sends the bundles it may see right after its checks).
func (g *grpcEndpoint) confirmStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	err := handler(srv, &confirmingStream{ServerStream: ss, g: g})
	callDone(ss.Context())
	return err
}

type confirmingStream struct {
	grpc.ServerStream
	g    *grpcEndpoint
	once sync.Once
}

func (s *confirmingStream) SendMsg(m any) error {
	err := s.ServerStream.SendMsg(m)
	if err == nil {
		s.once.Do(func() { s.g.confirm(s.Context()) })
	}
	return err
}

// confirming is an SDS stream's authenticator (grant checks included)
// confirming the connection when it succeeds: an SDS stream may be
// authenticated and still wait for its first response (a resource name
// it does not serve yet). SDS's own checks after it (an identity of the
// local trust domain) cannot fail for what the authenticators return.
func (g *grpcEndpoint) confirming(auth authn.Authenticator) authn.Authenticator {
	return authn.AuthenticatorFunc(func(ctx context.Context, r authn.Request) (authn.Identity, error) {
		id, err := auth.Authenticate(ctx, r)
		if err == nil {
			g.confirm(ctx)
		}
		return id, err
	})
}

// certService is Istio's certificate service and trustbridge's identity
// service, with the authentication, grants and trust they share.
func (g *grpcEndpoint) certService(o GRPCConfig, td spiffeid.TrustDomain, authority *ca.Authority, fed *federationSetup,
	auth authn.Authenticator, merged bool, reg prometheus.Registerer, logger *slog.Logger) (*certservice.Service, error) {
	allow, err := o.Downstream.parse(td)
	if err != nil {
		return nil, err
	}
	return certservice.New(certservice.Config{
		Signer:        authority,
		Authenticator: auth,
		// --ca-response-roots merged: filtered by the trust policy, as
		// Bundles are for WatchBundles.
		MergedRoots:  merged,
		QueueSize:    o.queueSize,
		Concurrency:  o.signConcurrency,
		QueueTimeout: o.queueTimeout,
		RateLimit:    rate.Limit(o.rateLimit),
		// A signing request that passed every check confirms its
		// connection before it waits in the queue: in a burst the wait
		// may outlast pendingStreams' patience or the first-call deadline.
		Authorized: g.confirm,
		Logger:     logger,
		Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"trust_domain": td.Name()}, reg),

		// Renewal chains end with their grant (grants.go).
		Grants:             g.grants,
		MaxRenewalLifetime: o.MaxRenewalLifetime,
		// Issuer grants bound their certificates' lives (boundTTL).
		DefaultTTL: authority.DefaultWorkloadTTL(),
		// Node proxies may impersonate the pods of their node.
		Impersonator: g.impersonator,
		// Kubernetes workloads' DNS names (workload_dns.go).
		WorkloadDNSNames: g.dnsNames,
		// trustbridge.identity.v1.IdentityService (identity_wiring.go):
		// JWT-SVIDs, and bundle streams filtered by the trust policy
		// that filters SDS.
		JWT:    o.ledger.jwtSigner(jwtSigner(authority, o.TestJWT)),
		Issued: o.ledger.issued(),
		// Clients re-issue what a tainted authority signed (ca_authorities.go).
		Taints:        o.taints.source(),
		ReissueSpread: o.ReissueSpread,
		JWTIssuer:     o.jwtIssuer,
		Bundles:       &storeBundles{store: fed.store},
		Policy:        o.access,
		// Intermediates of downstream trustbridges (downstream.go).
		Intermediates:    authority,
		DownstreamAllow:  allow,
		TrustDomain:      td,
		MaxDownstreamTTL: o.Downstream.maxTTL,
	})
}

// responseRoots is whether --ca-response-roots puts every trust domain's
// roots the trust policy allows after issued chains as one flat list (with
// a warning), or only the local roots (the signing roots, which the
// service always sends).
func (g *grpcEndpoint) responseRoots(o GRPCConfig, td spiffeid.TrustDomain, logger *slog.Logger) (bool, error) {
	switch o.ResponseRoots {
	case RootsMerged:
		g.roots = RootsMerged
		logger.Warn("--ca-response-roots merged: every federated trust domain's roots the trust policy lets a workload trust are appended to its issued chains as one flat list; "+
			"a client that cannot tell trust domains apart (an Istio sidecar, a tool reading one PEM file) trusts a peer's CA for "+
			"this trust domain too, so a peer can impersonate local workloads to it. Use local unless every caller checks trust "+
			"domains itself; trustbridge ca request and agent get federated trust per trust domain either way", "trust_domain", td.Name())
		return true, nil
	case "", RootsLocal:
		g.roots = RootsLocal
		return false, nil
	default:
		return false, fmt.Errorf("--ca-response-roots %q: want local or merged", o.ResponseRoots)
	}
}

// checkGRPCOff refuses flags that only the certificate service uses when
// it is off (--grpc-listen ""): silently ignoring an issuer list or a DNS
// name template would hide a configuration that never takes effect.
func checkGRPCOff(o GRPCConfig) error {
	var errs []error
	if o.OIDC.File != "" || o.OIDC.inline != nil {
		errs = append(errs, fmt.Errorf("%s: OIDC issuers authenticate callers of the certificate service, which --grpc-listen \"\" turns off; set --grpc-listen or remove them", o.OIDC.source()))
	}
	if o.WorkloadDNSNameTemplate != "" {
		errs = append(errs, errors.New("--workload-dns-name-template names certificates of the certificate service, which --grpc-listen \"\" turns off; set --grpc-listen or remove it"))
	}
	if len(o.NodeAgents) > 0 {
		errs = append(errs, errors.New("--ca-node-agent lets node agents ask the certificate service, which --grpc-listen \"\" turns off; set --grpc-listen or remove it"))
	}
	return errors.Join(errs...)
}

// checkGRPCFlags checks the signing limits, the node proxies' accounts
// and the grant flags.
func checkGRPCFlags(o GRPCConfig) error {
	// !(x >= 0) also refuses NaN, which a limiter treats as no limit.
	if !(o.rateLimit >= 0) || o.queueSize < 0 {
		return fmt.Errorf("--sign-rate-limit (%v) and --sign-queue-size (%d) must be numbers, not negative", o.rateLimit, o.queueSize)
	}
	if o.signConcurrency < 0 || o.queueTimeout < 0 {
		return fmt.Errorf("--sign-concurrency (%d) and --sign-queue-timeout (%s) must not be negative (0 takes the default)", o.signConcurrency, o.queueTimeout)
	}
	// 0 is the default (a Config built in code).
	if o.ReissueSpread != 0 && (o.ReissueSpread < time.Second || o.ReissueSpread > caclient.MaxReissueSpread) {
		return fmt.Errorf("--reissue-spread %s is outside 1s to %s: agents spread their re-issues over it after a taint", o.ReissueSpread, caclient.MaxReissueSpread)
	}
	for _, acct := range nonEmpty(o.TrustedNodeAccounts) {
		if err := nodeauth.CheckAccount(acct); err != nil {
			return fmt.Errorf("--ca-trusted-node-accounts %q: %w", acct, err)
		}
	}
	return checkGrantFlags(o)
}

// sds builds the Envoy SDS server that shares the certificate service's
// listener and authenticators: validation contexts from the trust store,
// pushed on every change, and, unless --sds-workload-certs=false, the
// caller's own certificate minted by the CA for the identity it proved.
func (g *grpcEndpoint) sds(o GRPCConfig, td spiffeid.TrustDomain, ttl time.Duration, authority *ca.Authority,
	fed *federationSetup, auth authn.Authenticator, reg prometheus.Registerer, logger *slog.Logger) (*sds.Server, error) {
	cfg := sds.Config{
		TrustDomain:   td,
		Authenticator: auth,
		Policy:        o.access,
		Logger:        logger.With(logattr.Component, "sds"),
		Registerer:    prometheus.WrapRegistererWith(prometheus.Labels{"trust_domain": td.Name()}, reg),
	}
	if !o.noSDSCerts {
		minter, err := sds.NewMinter(sds.MinterConfig{Signer: authoritySigner{authority}, TTL: ttl,
			WorkloadDNSNames: g.dnsNames, Logger: cfg.Logger, Registerer: cfg.Registerer})
		if err != nil {
			return nil, err
		}
		cfg.Credentials = minter
		g.sdsCerts = true
		// What a tainted authority signed is minted anew, at once: these
		// are signed here, no network burst to spread.
		o.taints.follow(func(taints []certservice.Tainted) {
			if n := minter.Expire(signedByTainted(taints)); n > 0 {
				cfg.Logger.Info("SDS credentials signed by a tainted CA authority are minted anew", "credentials", n)
			}
		})
	}
	cfg.Trust = &storeTrust{store: fed.store}
	return sds.New(cfg)
}

// authenticators builds the chain in Istio's order: an X509-SVID of the
// local trust domain, then a Kubernetes service account token (of this
// cluster, by TokenReview), then a token of a configured OIDC or remote
// Kubernetes issuer, then a bootstrap token. The first that succeeds
// decides; TokenReview leaves the configured issuers' tokens alone.
func (g *grpcEndpoint) authenticators(o GRPCConfig, td spiffeid.TrustDomain, authority *ca.Authority,
	reg prometheus.Registerer, logger *slog.Logger) (authn.Chain, error) {
	lim := o.authnLimits.withDefaults()
	if err := lim.check(); err != nil {
		return nil, err
	}
	// Only a leaf our CA signed carries a grant we wrote: a downstream's
	// intermediate (or the upstream) verifies against the same roots and
	// could write any grant into a leaf of any identity.
	svid := authn.NewX509SVID(td, authority, nil,
		authn.WithMaxVerifications(lim.verifyPerPeer, lim.verifyMax),
		authn.WithOwnIssuers(authority.IssuedHere),
		authn.WithLogger(logger.With(logattr.Component, "x509-svid")))
	if err := svid.Register(reg); err != nil {
		return nil, err
	}
	chain := authn.Chain{svid}
	g.methods = append(g.methods, authn.MethodX509SVID)

	oa, err := g.oidcAuthenticator(o, td, reg, logger)
	if err != nil {
		return nil, err
	}
	var otherIssuers []string
	if oa != nil {
		otherIssuers = oa.Issuers()
	}
	tr, err := g.tokenReview(o, lim, td, otherIssuers, reg, logger)
	if err != nil {
		return nil, err
	}
	if tr != nil {
		chain = append(chain, tr)
	}
	if oa != nil {
		chain = append(chain, oa)
		g.methods = append(g.methods, "oidc ("+strconv.Itoa(len(oa.Issuers()))+" issuers)")
	}
	if o.BootstrapFile != "" {
		boot, err := bootstrapTokens(o, td, reg, logger)
		if err != nil {
			return nil, err
		}
		chain = append(chain, boot)
		g.addBootstrapGrants(boot)
		g.tokens = boot
		g.runners = append(g.runners, boot.Run)
		g.methods = append(g.methods, authn.MethodBootstrapToken)
	}
	return chain, nil
}

// tokenReview is the service account token authenticator as --token-review
// says (auto: when a Kubernetes config is found), with the grants and
// impersonation that need the same client; nil when tokens are off.
func (g *grpcEndpoint) tokenReview(o GRPCConfig, lim authnLimits, td spiffeid.TrustDomain, otherIssuers []string,
	reg prometheus.Registerer, logger *slog.Logger) (*authn.TokenReview, error) {
	mode := o.TokenReview
	if mode == "" {
		mode = tokenReviewAuto
	}
	switch mode {
	case TokenReviewOff:
		return nil, nil
	case tokenReviewAuto, TokenReviewOn:
	default:
		return nil, fmt.Errorf("--token-review %q: want auto, on or off", o.TokenReview)
	}
	cfg, ok, err := LoadKubeConfig(o.Kubeconfig)
	if err != nil {
		return nil, err
	}
	if !ok {
		if mode == TokenReviewOn {
			return nil, errors.New("--token-review on needs --kubeconfig or an in-cluster config (KUBERNETES_SERVICE_HOST)")
		}
		logger.Info("no Kubernetes config; service account tokens are not accepted (--token-review auto)")
		return nil, nil
	}
	cfg = rest.CopyConfig(cfg)
	// Agents renew in waves; client-go's default of 5 calls a second
	// would queue their reviews. Successful reviews are cached.
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	var issuerKeys authn.FetchFunc
	if !lim.noIssuerKeys {
		issuerKeys = authn.RESTFetch(client.Discovery().RESTClient())
	}
	tr, err := authn.NewTokenReview(authn.TokenReviewConfig{
		Client: client, TrustDomain: td, Audience: o.tokenAudience, ClusterID: o.ClusterID,
		MaxReviewsPerPeer: lim.reviewPerPeer, PeerReviewRate: lim.peerRate(), PeerReviewBurst: lim.reviewPeerBurst,
		IssuerKeys: issuerKeys, OtherIssuers: otherIssuers,
		Logger: logger.With(logattr.Component, "token-review"), Registerer: reg,
	})
	if err != nil {
		return nil, err
	}
	g.runners = append(g.runners, tr.Run)
	if err := g.addServiceAccountGrants(client, o.OnServiceAccountDeleted, logger); err != nil {
		return nil, err
	}
	if err := g.addImpersonation(client, o, td, logger); err != nil {
		return nil, err
	}
	g.methods = append(g.methods, authn.MethodKubernetesJWT)
	return tr, nil
}

// LoadKubeConfig returns the Kubernetes client configuration (the
// server's, and the node agent's): from path when set, else the
// in-cluster one when running in a pod (KUBERNETES_SERVICE_HOST set). ok
// is false when there is neither.
func LoadKubeConfig(path string) (cfg *rest.Config, ok bool, err error) {
	if path != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, false, fmt.Errorf("--kubeconfig %s: %w", path, err)
		}
	} else {
		if os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
			return nil, false, nil
		}
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, false, fmt.Errorf("in-cluster Kubernetes config: %w", err)
		}
	}
	return rest.AddUserAgent(cfg, "trustbridge"), true, nil
}

// close releases the listener when the server does not start after all.
func (g *grpcEndpoint) close() {
	if g != nil && g.ln != nil {
		_ = g.ln.Close()
	}
}

// report prints the service in the banner and logs it.
// printBanner adds the service's lines to the start banner.
func (g *grpcEndpoint) printBanner(w io.Writer) {
	if g == nil {
		return
	}
	addr := g.ln.Addr().String()
	dns := ""
	if g.dnsNames != nil {
		dns = "; workload DNS names: " + g.dnsNames.String()
	}
	fmt.Fprintf(w, "  ca api:     %s (gRPC IstioCertificateService, TLS as %s; roots: %s; auth: %s%s)\n", addr, g.id, g.roots, strings.Join(g.methods, ", "), dns)
	certs := "validation contexts only"
	if g.sdsCerts {
		certs = "validation contexts and callers' own certificates"
	}
	fmt.Fprintf(w, "  sds:        %s (Envoy SecretDiscoveryService on the same listener: %s)\n", addr, certs)
	fmt.Fprintf(w, "  request:    trustbridge ca request --ca-addr %s --root-cert root-cert.pem --token-file TOKEN --credentials-dir ./creds\n", addr)
}

// logStart logs the service's start-up record.
func (g *grpcEndpoint) logStart(logger *slog.Logger) {
	if g == nil {
		return
	}
	logger.Info("certificate service listening", logattr.Address, g.ln.Addr().String(), logattr.SPIFFEID, g.id.String(),
		"response_roots", g.roots, "authenticators", strings.Join(g.methods, ","), "sds_workload_certs", g.sdsCerts)
}

// parts are the service's long-running parts, for runAll.
func (g *grpcEndpoint) parts() []func(context.Context) error {
	if g == nil {
		return nil
	}
	return g.runners
}
