package connlimit

import (
	"net"
	"net/netip"
)

// sourceOf is the key a connection is counted under: an IPv4 address, or
// the /64 of an IPv6 one. An IPv4-mapped IPv6 address (a dual-stack
// listener's IPv4 client) counts as its IPv4 address. An address that is
// not IP (a Unix socket, a test's pipe) is its own key as written, so such
// clients share one budget rather than escape it.
func sourceOf(a net.Addr) string {
	ap, ok := addrPortOf(a)
	if !ok {
		if a == nil {
			return ""
		}
		return a.String()
	}
	ip := ap.Addr()
	if ip.Is4() {
		return ip.String()
	}
	p, _ := ip.Prefix(64) // cannot fail: 64 bits of an IPv6 address
	return p.String()
}

// addrPortOf is a's IP and port, unmapped and without a zone, so that the
// same connection seen through different wrappers gives the same value.
func addrPortOf(a net.Addr) (netip.AddrPort, bool) {
	var ap netip.AddrPort
	switch a := a.(type) {
	case nil:
		return ap, false
	case *net.TCPAddr:
		ap = a.AddrPort()
	default:
		var err error
		if ap, err = netip.ParseAddrPort(a.String()); err != nil {
			return ap, false
		}
	}
	if !ap.Addr().IsValid() {
		return ap, false
	}
	return netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port()), true
}

// connKey names one TCP connection by its two ends.
type connKey struct{ remote, local netip.AddrPort }

func keyOf(remote, local net.Addr) (connKey, bool) {
	r, ok := addrPortOf(remote)
	if !ok {
		return connKey{}, false
	}
	l, ok := addrPortOf(local)
	return connKey{remote: r, local: l}, ok
}
