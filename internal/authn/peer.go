package authn

import (
	"net"
	"net/netip"
	"sync"
)

// peerKey reduces a peer address ("ip:port") to the address: a port is
// never part of the key, since a client opens as many connections as it
// likes. IPv6 addresses count whole, not by /64: Kubernetes gives all the
// pods of a node one /64, so a /64 key would make a node of pods one
// caller and starve them on a restart, while a host that picks addresses
// from its own /64 is still held by the global bounds. An address that
// does not parse (a test's bufconn, an empty peer) is its own key, so
// such callers share one budget rather than escape it.
func peerKey(addr string) string {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return addr
	}
	return ip.Unmap().WithZone("").String()
}

// Scopes of a refusal by a gate or limiter, the label of the throttling
// metrics.
const (
	scopePeer   = "peer"   // the caller's address has its share in flight
	scopeGlobal = "global" // every slot is taken
	scopeRate   = "rate"   // the caller's address is over its rate
)

// peerGate bounds work in flight per peer key and in total. A peer's
// count leaves the map at zero, so the map never holds more keys than
// there are slots. Safe for concurrent use.
type peerGate struct {
	perPeer, global int

	mu     sync.Mutex
	total  int
	byPeer map[string]int
}

func newPeerGate(perPeer, global int) *peerGate {
	return &peerGate{perPeer: perPeer, global: global, byPeer: make(map[string]int)}
}

// acquire takes a slot for key, or says which bound refused it.
func (g *peerGate) acquire(key string) (ok bool, scope string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.byPeer[key] >= g.perPeer:
		return false, scopePeer
	case g.total >= g.global:
		return false, scopeGlobal
	}
	g.byPeer[key]++
	g.total++
	return true, ""
}

func (g *peerGate) release(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.total--
	if g.byPeer[key]--; g.byPeer[key] <= 0 {
		delete(g.byPeer, key)
	}
}

func (g *peerGate) inFlight(key string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.byPeer[key]
}
