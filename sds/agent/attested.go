package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/sds"
	"github.com/trustbridge/trustbridge/sds/attest"
)

// IdentityMap is the identity map in force (identitymap.Cell).
type IdentityMap interface {
	Load() *identitymap.Map
}

// AttestedAuthenticator authenticates the caller of a socket served with
// Attestor's credentials (attest.Attestor.Credentials): it attests the
// calling process and gives it the identity Map grants its facts, so one
// node agent serves each workload of its node its own identity. A process
// that cannot be attested, or whose facts grant none, is refused with
// authn.ErrNotAttested and the reason, never given a default identity.
// The servers authenticate each stream when it opens and again at every
// refresh, so a pod whose service account changed, or a process that
// moved cgroup, is attested anew and gets the identity it has now.
type AttestedAuthenticator struct {
	Attestor *attest.Attestor
	Map      IdentityMap
	// NodeName is this node's name, a fact of every pod on it.
	NodeName string
}

var _ authn.Authenticator = (*AttestedAuthenticator)(nil)

// Authenticate attests the caller of ctx's RPC and maps its facts.
func (a *AttestedAuthenticator) Authenticate(ctx context.Context, r authn.Request) (authn.Identity, error) {
	ident, err := a.Identify(ctx, r)
	if err != nil {
		return authn.Identity{}, err
	}
	return authn.Identity{ID: ident.ID, Method: authn.MethodAttestation}, nil
}

// Identify is Authenticate with all the map gives: the ID, and the TTL
// and DNS names of the rules that gave it.
func (a *AttestedAuthenticator) Identify(ctx context.Context, _ authn.Request) (identitymap.Identity, error) {
	facts, err := a.Attestor.AttestPeer(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return identitymap.Identity{}, ctx.Err()
		}
		if status.Code(attest.Status(err)) == codes.Unavailable {
			return identitymap.Identity{}, fmt.Errorf("%w: %w: %w", authn.ErrNotAttested, authn.ErrUnavailable, err)
		}
		return identitymap.Identity{}, fmt.Errorf("%w: %w", authn.ErrNotAttested, err)
	}
	m := a.Map.Load()
	if m == nil {
		return identitymap.Identity{}, fmt.Errorf("%w: %w: no identity map loaded yet", authn.ErrNotAttested, authn.ErrUnavailable)
	}
	ident, err := m.Identify(a.workload(facts))
	if err != nil {
		return identitymap.Identity{}, fmt.Errorf("%w: pid %d: %w", authn.ErrNotAttested, facts.PID, err)
	}
	return ident, nil
}

// workload is facts as the identity map reads them.
func (a *AttestedAuthenticator) workload(facts attest.Facts) identitymap.Workload {
	w := identitymap.Workload{
		Unix: true, UID: facts.Unix.UID, GID: facts.Unix.GID, User: facts.Unix.User, Group: facts.Unix.Group,
		BinaryPath: facts.Unix.BinaryPath, BinarySHA256: facts.Unix.BinarySHA256,
	}
	if k := facts.Kubernetes; k != nil {
		w.Kubernetes = true
		w.Namespace, w.ServiceAccount, w.PodName, w.PodUID = k.Namespace, k.ServiceAccount, k.PodName, k.PodUID
		w.PodLabels, w.NodeName, w.ContainerName, w.Image = k.Labels, a.NodeName, k.ContainerName, k.Image
	}
	return w
}

// CredentialSource hands each authenticated caller the certificate of its
// own identity from c: an SDS or Workload API stream holds the identity
// from its first request until it ends (then the cache lingers, and drops
// the identity once no stream holds it). A stream holds one identity
// however often it asks (at every re-authentication).
//
// It is an sds.IdentityCredentialSource: a caller authenticated with DNS
// names (authn.Identity.DNSNames, the identity map's) holds the
// certificate of its ID with exactly those names.
func (c *IdentityCache) CredentialSource() sds.CredentialSource {
	return &cacheSource{c: c}
}

type cacheSource struct {
	c     *IdentityCache
	holds streamHolds
}

var _ sds.IdentityCredentialSource = (*cacheSource)(nil)

func (s *cacheSource) Credential(ctx context.Context, id spiffeid.ID) (*sds.Credential, error) {
	return s.CredentialFor(ctx, authn.Identity{ID: id})
}

func (s *cacheSource) CredentialFor(ctx context.Context, ident authn.Identity) (*sds.Credential, error) {
	h, err := s.holds.hold(ctx, IdentityRequest{ID: ident.ID, DNSNames: ident.DNSNames}, s.c.AcquireIdentity)
	if err != nil {
		return nil, err
	}
	return h.Credential(ctx, ident.ID)
}

// streamHolds holds one identity per stream or call, by its context,
// released when the context ends: a stream asking again for the identity
// it holds takes no new reference, and one that now proves another
// identity swaps its hold. (An SDS stream is authenticated with its
// handler's context and served with one derived from it: two holds for
// the stream's life, whatever its length.)
type streamHolds struct {
	mu sync.Mutex
	m  map[context.Context]*IdentityHandle
}

// held is ctx's handle, nil when it holds none.
func (s *streamHolds) held(ctx context.Context) *IdentityHandle {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[ctx]
}

// hold returns ctx's handle on req, acquiring it with acquire when ctx
// holds none or another identity (another ID, or other DNS names).
func (s *streamHolds) hold(ctx context.Context, req IdentityRequest, acquire func(context.Context, IdentityRequest) (*IdentityHandle, error)) (*IdentityHandle, error) {
	if ctx.Done() == nil {
		// Nothing would ever release it.
		return nil, errors.New("agent: an identity asked for outside a stream or call")
	}
	if h := s.held(ctx); h != nil && h.holds(req) {
		return h, nil
	}
	h, err := acquire(ctx, req)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.m == nil {
		s.m = make(map[context.Context]*IdentityHandle)
	}
	old, had := s.m[ctx]
	s.m[ctx] = h
	s.mu.Unlock()
	if had {
		old.Release()
		return h, nil
	}
	context.AfterFunc(ctx, func() {
		s.mu.Lock()
		last := s.m[ctx]
		delete(s.m, ctx)
		s.mu.Unlock()
		last.Release()
	})
	return h, nil
}
