package agent

import (
	"cmp"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/caclient"
)

// NodeCredentials is what a node agent proves its node with to the
// certificate service, and how it verifies that service, for one request.
type NodeCredentials struct {
	// Token is the node's bearer token (its projected service account
	// token); used when not empty.
	Token string
	// Certificate is the node's own X509-SVID, presented over mTLS when
	// there is no Token. Today's certificate service grants impersonation
	// only to a caller proven by its token.
	Certificate *tls.Certificate
	// Roots are the local trust domain's roots: the server is verified
	// with them, and so is every certificate issued through it.
	Roots []*x509.Certificate
	// ServerID is the SPIFFE ID the server must present.
	ServerID spiffeid.ID
}

// NodeCredentials returns the Rotator's credentials for a request made on
// behalf of another workload: the token file's token, re-read now, else
// the current certificate; the server roots and ID the Rotator holds now.
// It fails before a successful Init.
func (r *Rotator) NodeCredentials() (NodeCredentials, error) {
	r.mu.Lock()
	cur, roots, serverID := r.cur, r.roots, r.serverID
	r.mu.Unlock()
	if cur == nil || serverID.IsZero() {
		return NodeCredentials{}, errors.New("rotator: no node credentials before a successful Init")
	}
	nc := NodeCredentials{Roots: slices.Clone(roots), ServerID: serverID}
	if r.tokenFile != "" {
		token, err := caclient.ReadToken(r.tokenFile)
		if err != nil {
			return NodeCredentials{}, fmt.Errorf("rotator: token file: %w", err)
		}
		nc.Token = token
		return nc, nil
	}
	if !r.clock.Now().Before(cur.Leaf.NotAfter) {
		return NodeCredentials{}, fmt.Errorf("rotator: %w: the certificate expired at %s and there is no token file",
			errNoAuth, cur.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	nc.Certificate = cur
	return nc, nil
}

// ImpersonationConfig configures an ImpersonationFetcher.
type ImpersonationConfig struct {
	// CAAddr is host:port of the certificate service (required).
	CAAddr string
	// Node returns the node's credentials for each request (required):
	// (*Rotator).NodeCredentials.
	Node func() (NodeCredentials, error)
	// TTL is the lifetime to ask for, in whole seconds; zero leaves it to
	// the server.
	TTL time.Duration
	// Clock is the time certificates are verified at; the real clock
	// when nil.
	Clock clock.PassiveClock
}

// ImpersonationFetcher obtains the X509-SVIDs of the workloads of its node
// from the certificate service the way ztunnel does: authenticated as the
// node, with Istio's ImpersonatedIdentity naming the workload. The server
// decides; the fetcher checks what it gets.
type ImpersonationFetcher struct {
	addr  string
	node  func() (NodeCredentials, error)
	ttl   time.Duration
	clock clock.PassiveClock
}

// NewImpersonationFetcher checks cfg. It dials nothing.
func NewImpersonationFetcher(cfg ImpersonationConfig) (*ImpersonationFetcher, error) {
	switch {
	case cfg.CAAddr == "":
		return nil, errors.New("agent: impersonation: no certificate service address")
	case cfg.Node == nil:
		return nil, errors.New("agent: impersonation: no node credentials")
	case cfg.TTL < 0 || cfg.TTL%time.Second != 0:
		return nil, fmt.Errorf("agent: impersonation: ttl %s: want a whole, positive number of seconds", cfg.TTL)
	}
	f := &ImpersonationFetcher{addr: cfg.CAAddr, node: cfg.Node, ttl: cfg.TTL, clock: cfg.Clock}
	if f.clock == nil {
		f.clock = clock.RealClock{}
	}
	return f, nil
}

// FetchX509SVID asks for the certificate of id for key's public key (the
// key itself never leaves the agent) and returns the chain to present,
// leaf first, once checked: an X509-SVID for exactly id, for key,
// chaining to the local trust domain's roots at this time. Anything else
// is refused. A failed call returns its gRPC status (wrapped).
func (f *ImpersonationFetcher) FetchX509SVID(ctx context.Context, id spiffeid.ID, key crypto.Signer) ([]*x509.Certificate, error) {
	return f.FetchIdentity(ctx, IdentityRequest{ID: id}, key)
}

// FetchIdentity is FetchX509SVID for req: its DNS names go in the CSR
// (the server grants exactly those its own identity map gives a pod of
// this node with that ID, and may add its own) and the certificate must
// carry them; its TTL, when not zero, is asked for rather than the
// fetcher's (rounded up to whole seconds, clamped by the server).
func (f *ImpersonationFetcher) FetchIdentity(ctx context.Context, req IdentityRequest, key crypto.Signer) ([]*x509.Certificate, error) {
	id, ttl := req.ID, cmp.Or(req.TTL, f.ttl)
	nc, err := f.node()
	if err != nil {
		return nil, err
	}
	if id.TrustDomain() != nc.ServerID.TrustDomain() {
		// The server signs its own trust domain only; the node's roots
		// could not verify another one's anyway.
		return nil, fmt.Errorf("%s is not of the certificate service's trust domain %s", id, nc.ServerID.TrustDomain().Name())
	}
	answer, err := f.create(ctx, nc, req, key, (ttl + time.Second - 1).Truncate(time.Second))
	if err != nil {
		return nil, err
	}
	chain := caclient.LeafChain(answer)
	if _, err := caclient.CheckIssued(chain, key, id.TrustDomain(), id, nc.Roots, x509svid.WithTime(f.clock.Now())); err != nil {
		return nil, fmt.Errorf("%w for %s: %w", errUnusable, id, err)
	}
	for _, name := range req.DNSNames {
		if !slices.Contains(chain[0].DNSNames, name) {
			return nil, fmt.Errorf("%w for %s: the server left out the DNS name %s the request asked for", errUnusable, id, name)
		}
	}
	return chain, nil
}

// create makes one CreateCertificate for req with a CSR of key, naming
// its ID there (with its DNS names) as well as in the impersonation
// field, and returns the answer's certificates in order.
func (f *ImpersonationFetcher) create(ctx context.Context, nc NodeCredentials, req IdentityRequest, key crypto.Signer, ttl time.Duration) ([]*x509.Certificate, error) {
	id := req.ID
	cert := nc.Certificate
	if nc.Token != "" {
		cert = nil // one proof of the node: the one the server can grant impersonation to
	}
	chain, err := caclient.CreateCertificate(ctx, f.addr, caclient.ServerTLS(nc.Roots, nc.ServerID, cert),
		caclient.Request{Key: key, ID: id, DNSNames: req.DNSNames, TTL: ttl, Token: nc.Token, Impersonate: id})
	if err != nil {
		return nil, fmt.Errorf("the certificate service at %s, for %s: %w", f.addr, id, err)
	}
	return chain, nil
}
