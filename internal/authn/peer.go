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
// caller and starve them on a restart. A host that picks addresses from a
// /64 it controls is held by that network's larger share (peerNet) and
// the global bounds. An address that does not parse (a test's bufconn, an
// empty peer) is its own key, so such callers share one budget rather than
// escape it.
func peerKey(addr string) string {
	ip, ok := peerAddr(addr)
	if !ok {
		return addr
	}
	return ip.String()
}

// peerNet is the /64 of an IPv6 peer address, "" for any other: the key of
// the larger share (netShare times an address's) all addresses of one
// IPv6 network have together.
func peerNet(addr string) string {
	ip, ok := peerAddr(addr)
	if !ok || ip.Is4() {
		return ""
	}
	p, _ := ip.Prefix(64)
	return p.String()
}

// netShare is how many addresses' shares one IPv6 /64 has in all: enough
// for a node's pods restarting together, not for a flood from one host.
const netShare = 8

func peerAddr(addr string) (netip.Addr, bool) {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return ip.Unmap().WithZone(""), true
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

// acquire takes a slot for the peer at addr, or says which bound refused
// it: its address's share, its IPv6 network's, or the global one.
func (g *peerGate) acquire(addr string) (ok bool, scope string) {
	key, nkey := peerKey(addr), peerNet(addr)
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.byPeer[key] >= g.perPeer, nkey != "" && g.byPeer[nkey] >= netShare*g.perPeer:
		return false, scopePeer
	case g.total >= g.global:
		return false, scopeGlobal
	}
	g.byPeer[key]++
	if nkey != "" {
		g.byPeer[nkey]++
	}
	g.total++
	return true, ""
}

func (g *peerGate) release(addr string) {
	key, nkey := peerKey(addr), peerNet(addr)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.total--
	keys := []string{key}
	if nkey != "" {
		keys = append(keys, nkey)
	}
	for _, k := range keys {
		if g.byPeer[k]--; g.byPeer[k] <= 0 {
			delete(g.byPeer, k)
		}
	}
}

func (g *peerGate) inFlight(key string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.byPeer[key]
}
