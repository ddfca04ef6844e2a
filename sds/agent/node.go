package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/netutil"
	"github.com/trustbridge/trustbridge/sds"
	"github.com/trustbridge/trustbridge/sds/attest"
)

// NodeConfig makes the agent the identity provider of a whole node: it
// attests each process that opens the socket and serves it its own
// identity, as the identity map grants its facts, instead of one
// identity to whoever connects.
type NodeConfig struct {
	// Attestor attests the socket's callers (required): its Credentials
	// are the socket's transport credentials.
	Attestor *attest.Attestor
	// Map is the identity map in force (required).
	Map IdentityMap
	// NodeName is this node's name (Kubernetes' spec.nodeName).
	NodeName string
	// Runners run beside the agent for as long as it serves and fail it
	// when they return early: the pod informer, the identity map's file
	// source.
	Runners []func(context.Context) error
	// MaxIdentities bounds the identities held (DefaultMaxIdentities
	// when zero).
	MaxIdentities int
	// TTL is the lifetime asked for each workload certificate; zero
	// leaves it to the server.
	TTL time.Duration
	// Broker, when set, serves brokers (ztunnel, Cilium) the identities
	// of this node's workloads on a socket of its own (BrokerConfig).
	Broker *BrokerConfig
}

// nodeReattestInterval is how often a node agent attests the caller of an
// open stream again (SDS's re-authentication, the Workload API's
// re-selection): a process that moved cgroup, or an identity map edit,
// reaches open streams within it. Attestation reads a few /proc files and
// the informer's cache, so a minute costs little.
const nodeReattestInterval = time.Minute

// nodeTrustWait bounds how long a new caller waits for its workload's
// trust before its streams open with its own trust domain only (they get
// the rest pushed when it arrives).
const nodeTrustWait = firstTrustWait

// runNode serves the node: its own certificate (the Rotator, with the
// node's token) proves the node; each workload's certificate is asked for
// with ImpersonatedIdentity and its trust followed while it is held.
func (a *Agent) runNode(ctx context.Context) error {
	if a.rot == nil {
		return errors.New("agent: node mode needs the certificate service: set --ca-addr, --root-cert and --token-file")
	}
	if err := a.rot.Init(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("agent: the node's own certificate: %w", err)
	}
	node, ok := a.rot.(interface {
		NodeCredentials() (NodeCredentials, error)
	})
	if !ok {
		return errors.New("agent: node mode needs a Rotator")
	}
	// The workloads' trust streams on connections of their own, spread
	// (nodeConns); JWT-SVID requests on another, so that no stream can
	// hold them back.
	conns := &nodeConns{dial: func() (*grpc.ClientConn, error) { return nodeConn(a.caAddr, node.NodeCredentials) }}
	defer conns.Close()
	jwtConn, err := nodeConn(a.caAddr, node.NodeCredentials)
	if err != nil {
		return err
	}
	defer jwtConn.Close()
	auth, err := a.nodeParts(node.NodeCredentials, conns)
	if err != nil {
		return err
	}
	gs, err := a.nodeSDS(auth)
	if err != nil {
		return err
	}
	a.log.Info("serving the node's workloads, each its own attested identity", "ca_addr", a.caAddr,
		"node", a.node.NodeName, logattr.SPIFFEID, a.rot.ID().String())
	workers := append([]func(context.Context) error{a.rot.Run, auth.cache.Run}, a.node.Runners...)
	// The Workload API's and the brokers' callers share the Cells of
	// their identities, and the JWT-SVID minter (its limits per workload).
	cells := &nodeWorkloads{auth: auth, cache: auth.cache, trust: auth.trust, log: a.log}
	jwt := newNodeJWTMinter(jwtConn, a.clock, a.log)
	jwt.followTaints(&a.taints)
	defer jwt.close()
	if a.node.Broker != nil {
		serve, err := a.serveBrokers(auth, cells, jwt)
		if err != nil {
			return err
		}
		workers = append(workers, serve)
	}
	return a.serveOn(ctx, gs, netutil.AnyUser, a.nodeWorkloadAPI(cells, jwt), nil, workers...)
}

// nodeSDS is the node's SDS server, each caller authenticated by auth.
func (a *Agent) nodeSDS(auth *nodeAuthenticator) (*grpc.Server, error) {
	srv, err := sds.New(sds.Config{
		TrustDomain:    auth.trust.local,
		Trust:          auth.trust,
		Credentials:    auth.cache.CredentialSource(),
		Authenticator:  auth,
		Policy:         auth.trust,
		RootCA:         a.rootCA,
		ReauthInterval: nodeReattestInterval,
		Clock:          a.clock,
		Logger:         a.log,
		Registerer:     a.reg,
	})
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	gs := newLocalGRPCServer(grpc.Creds(a.node.Attestor.Credentials()))
	srv.Register(gs)
	return gs, nil
}

// nodeWorkloadAPI is the node's Workload API, each caller served its own
// identity from cells (JWT-SVIDs minted by jwt); nil without a socket
// for it.
func (a *Agent) nodeWorkloadAPI(cells *nodeWorkloads, jwt *jwtMinter) *workloadAPI {
	if a.wlSocket == "" {
		return nil
	}
	return &workloadAPI{
		sel:       cells,
		creds:     a.node.Attestor.Credentials(),
		reselect:  nodeReattestInterval,
		callerJWT: jwt,
	}
}

// nodeParts builds the node's workload trust (followed on conns), its
// identity cache (certificates fetched as the node) and the authenticator
// of its sockets over them.
func (a *Agent) nodeParts(node func() (NodeCredentials, error), conns *nodeConns) (*nodeAuthenticator, error) {
	fetcher, err := NewImpersonationFetcher(ImpersonationConfig{CAAddr: a.caAddr, Node: node, TTL: a.node.TTL, Clock: a.clock})
	if err != nil {
		return nil, err
	}
	nt, err := newNodeTrust(a.rot.ID().TrustDomain(), trustWatchOn(conns, &a.jwtIssuer, &a.taints, a.log), a.rot.SetServerRoots, a.clock, a.log, a.metrics)
	if err != nil {
		return nil, err
	}
	cache, err := NewIdentityCache(IdentityCacheConfig{
		Fetcher: fetcher, MaxIdentities: a.node.MaxIdentities, Clock: a.clock,
		Logger: a.log, Registerer: a.reg, Companion: nt.follow,
	})
	if err != nil {
		return nil, err
	}
	nt.revoke = cache.Revoke
	cache.taintReissues = a.metrics.taintReissues
	a.taints.follow(cache.setTaints)
	return &nodeAuthenticator{
		attested: &AttestedAuthenticator{Attestor: a.node.Attestor, Map: a.node.Map, NodeName: a.node.NodeName},
		cache:    cache,
		trust:    nt,
	}, nil
}

// nodeAuthenticator authenticates a caller of the node's socket by
// attestation (AttestedAuthenticator) and, before the stream is served,
// holds its identity in the cache for as long as the stream lasts: the
// certificate is fetched (the server decides whether this node may have
// it) and the workload's trust has arrived, so its first validation
// context already carries its federated trust domains.
type nodeAuthenticator struct {
	attested authn.Authenticator
	cache    *IdentityCache
	trust    *nodeTrust

	// holds are the identities held per stream (its context): a stream
	// re-authenticated as the same identity keeps its hold.
	holds streamHolds
}

func (n *nodeAuthenticator) Authenticate(ctx context.Context, r authn.Request) (authn.Identity, error) {
	ident, err := n.identify(ctx, r)
	if err != nil {
		return authn.Identity{}, err
	}
	if err := n.hold(ctx, identityRequest(ident)); err != nil {
		return authn.Identity{}, err
	}
	return authn.Identity{ID: ident.ID, Method: authn.MethodAttestation, DNSNames: ident.DNSNames}, nil
}

// identityRequest is what the cache is asked for a workload the map gave
// ident.
func identityRequest(ident identitymap.Identity) IdentityRequest {
	return IdentityRequest{ID: ident.ID, DNSNames: ident.DNSNames, TTL: ident.TTL}
}

// identifier is an authenticator that tells all the identity map gives
// (AttestedAuthenticator): the TTL too.
type identifier interface {
	Identify(ctx context.Context, r authn.Request) (identitymap.Identity, error)
}

// identify attests and maps the caller.
func (n *nodeAuthenticator) identify(ctx context.Context, r authn.Request) (identitymap.Identity, error) {
	if i, ok := n.attested.(identifier); ok {
		return i.Identify(ctx, r)
	}
	ident, err := n.attested.Authenticate(ctx, r)
	return identitymap.Identity{ID: ident.ID}, err
}

// hold acquires req for ctx's stream unless it holds it already, and
// waits for its trust. A certificate the server refuses refuses the
// caller: the server alone decides which identities run on this node.
func (n *nodeAuthenticator) hold(ctx context.Context, req IdentityRequest) error {
	if held := n.holds.held(ctx); held != nil && !held.holds(req) {
		// Re-attested as another identity (or the same ID with other DNS
		// names): the stream ends, and its caller reconnects to be served
		// the one it has now. Never kept on the old one, as a failure to
		// get the new one (an outage) would otherwise keep it.
		return fmt.Errorf("%w: the caller now attests as %s, not %s; reconnect", authn.ErrNotAttested, describe(req.ID, req.DNSNames), describe(held.ID(), held.DNSNames()))
	}
	_, err := n.holds.hold(ctx, req, n.acquire)
	return err
}

// describe is id, with its DNS names when it has any, for errors.
func describe(id spiffeid.ID, dnsNames []string) string {
	if len(dnsNames) == 0 {
		return id.String()
	}
	return fmt.Sprintf("%s (DNS names %s)", id, strings.Join(dnsNames, ", "))
}

// refusal is the caller's error for a certificate the cache could not
// get: the server's refusal refuses the caller (the server alone decides
// which identities run on this node), anything else is Unavailable.
func (n *nodeAuthenticator) refusal(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if status.Code(err) == codes.PermissionDenied {
		return fmt.Errorf("%w: %w", authn.ErrNotAttested, err)
	}
	return fmt.Errorf("%w: %w: %w", authn.ErrNotAttested, authn.ErrUnavailable, err)
}

// checkNode refuses a node mode the agent cannot run, saying what to
// set.
func checkNode(cfg Config) error {
	n := cfg.Node
	switch {
	case n == nil:
		return nil
	case n.Attestor == nil || n.Map == nil:
		return errors.New("agent: node mode needs an attestor and an identity map")
	case cfg.Rotator == nil:
		return errors.New("agent: node mode needs the certificate service: set --ca-addr, --root-cert and --token-file")
	case cfg.Rotator.TokenFile == "":
		return errors.New("agent: node mode needs --token-file (the node agent's projected service account token): the certificate service lets a node ask for its workloads' certificates only on the node's token")
	case n.Broker != nil && n.Broker.Policy == nil:
		return errors.New("agent: brokers are served only to those allowed: set --broker-allow (e.g. sa:istio-system/ztunnel)")
	case n.MaxIdentities < 0 || n.TTL < 0:
		return fmt.Errorf("agent: node mode: maximum identities (%d) and TTL (%s) must not be negative", n.MaxIdentities, n.TTL)
	}
	return nil
}
