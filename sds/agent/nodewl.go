package agent

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/logattr"
	wapi "github.com/trustbridge/trustbridge/sds/workload"
)

// nodeWorkloads is a node agent's Workload API Selector: each call's
// caller is attested (as on the SDS socket) and served the Cell of its own
// identity, which holds the identity's certificate from the cache and the
// bundles the server's policy lets that workload trust. A Cell lives
// while a call holds its identity, and is shared by every call of that
// identity, so a rotation is encoded once for all of them.
type nodeWorkloads struct {
	auth  *nodeAuthenticator
	cache *IdentityCache
	trust *nodeTrust
	log   *slog.Logger

	mu    sync.Mutex
	cells map[identityKey]*identityCell // by the cache's key: ID and DNS names
}

// identityCell is one identity's Workload API State, kept up to date by
// its maintain goroutine while calls hold it.
type identityCell struct {
	cell   *wapi.Cell
	e      *identityEntry // the cache entry it is fed from
	refs   int
	cancel context.CancelFunc
}

var _ wapi.Selector = (*nodeWorkloads)(nil)

// Select attests the caller of ctx's call, holds its identity for the
// call (the certificate fetched, the trust arrived) and returns its Cell.
func (n *nodeWorkloads) Select(ctx context.Context) (wapi.Source, func(), error) {
	ident, err := n.auth.identify(ctx, authn.FromGRPC(ctx))
	if err != nil {
		return nil, nil, err
	}
	h, err := n.auth.acquire(ctx, identityRequest(ident))
	if err != nil {
		return nil, nil, err
	}
	c := n.ref(h)
	return c.cell, func() {
		n.unref(c)
		h.Release()
	}, nil
}

// ref takes a reference on the Cell of h's identity (its ID with its DNS
// names), making it (and its maintain goroutine, fed from h's entry) when
// there is none.
func (n *nodeWorkloads) ref(h *IdentityHandle) *identityCell {
	n.mu.Lock()
	defer n.mu.Unlock()
	key := h.e.ident
	if c := n.cells[key]; c != nil && c.e == h.e {
		c.refs++
		return c
	}
	// None, or one fed from an entry the cache has since replaced (the
	// identity was revoked, then granted again): a new Cell, which the
	// old one's holders move to when they select again.
	ctx, cancel := context.WithCancel(context.Background())
	c := &identityCell{cell: wapi.NewCell(), e: h.e, refs: 1, cancel: cancel}
	if n.cells == nil {
		n.cells = make(map[identityKey]*identityCell)
	}
	n.cells[key] = c
	// The first State before the Cell is handed out: the holder has a
	// certificate, and its trust has arrived or it waited long enough.
	n.publish(key.id, c, h.e.state.Load())
	// The goroutine holds the entry itself: it may still be publishing
	// the key when the last call lets go of h.
	held := h.hold()
	go func() {
		defer held.Release()
		n.maintain(ctx, key.id, c, held.e)
	}()
	return c
}

func (n *nodeWorkloads) unref(c *identityCell) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if c.refs--; c.refs == 0 {
		c.cancel()
		if n.cells[c.e.ident] == c {
			delete(n.cells, c.e.ident)
		}
	}
}

// maintain republishes c whenever e's certificate or id's bundles
// change, until the last call holding c ends. The entry outlives c: a
// call's handle holds it.
func (n *nodeWorkloads) maintain(ctx context.Context, id spiffeid.ID, c *identityCell, e *identityEntry) {
	for {
		st := e.state.Load()
		_, bundlesChanged := n.trust.bundlesFor(id)
		n.publish(id, c, st)
		select {
		case <-ctx.Done():
			return
		case <-st.changed:
		case <-bundlesChanged:
		}
	}
}

// publish sets c to st's certificate with id's bundles; without a
// certificate (it expired unrenewed) the Cell serves no identity.
func (n *nodeWorkloads) publish(id spiffeid.ID, c *identityCell, st *identityState) {
	bundles, _ := n.trust.bundlesFor(id)
	next := wapi.State{Bundles: bundles}
	if st.cred != nil {
		next.SVID = &wapi.SVID{ID: id, Chain: st.cred.Chain, Key: st.cred.Key}
	}
	if len(bundles) == 0 {
		// Before its trust arrived: the local trust domain's roots the
		// certificate chains to, which the node's trust holds.
		next.Bundles = n.trust.localBundles()
	}
	if err := c.cell.Set(next); err != nil {
		n.log.Warn("cannot serve this workload's Workload API state; keeping the last good one", logattr.SPIFFEID, id.String(), logattr.Error, err.Error())
	}
}

// acquire holds req for a call and waits for its trust, as hold does for
// a stream, mapping the cache's refusals to the caller's.
func (n *nodeAuthenticator) acquire(ctx context.Context, req IdentityRequest) (*IdentityHandle, error) {
	id := req.ID
	h, err := n.cache.AcquireIdentity(ctx, req)
	if err != nil {
		return nil, n.refusal(ctx, err)
	}
	if err := n.trust.wait(ctx, id, nodeTrustWait); err != nil && ctx.Err() == nil {
		n.trust.log.Warn("serving a workload its own trust domain only until the server sends its trust", logattr.SPIFFEID, id.String(), logattr.Error, err.Error())
	}
	if err := ctx.Err(); err != nil {
		h.Release()
		return nil, fmt.Errorf("agent: %w", err)
	}
	return h, nil
}
