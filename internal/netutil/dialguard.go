package netutil

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
)

// ErrRefusedAddress is wrapped by every refusal of Control.
var ErrRefusedAddress = errors.New("refused address")

// Class is how a dial address is judged.
type AddrClass int

const (
	// Open: any fetch may connect.
	AddrOpen AddrClass = iota
	// Local: loopback, unspecified, 0.0.0.0/8 and link-local addresses.
	// A lab or a test reaches a peer this way, so an operator may allow
	// them.
	AddrLocal
	// Never: cloud metadata and credential services, multicast and
	// broadcast. Allowing private addresses does not open them: no
	// configured fetch target is served there, while a URL or redirect
	// pointing there is the classic way to read instance credentials, and
	// a lab that needs loopback should not have to give that up too.
	AddrNever
)

// Verdict is the class of an address and, unless it is Open, why.
type AddrVerdict struct {
	Class AddrClass
	Why   string
}

// Control returns a net.Dialer Control function that refuses Never
// addresses always and Local ones unless allowPrivate is set. hint names
// the flag or configuration key that allows Local addresses (e.g.
// "--federation-allow-private" or "allowPrivateAddresses"); refusals say
// to set it, or that even it would not help.
func DialControl(allowPrivate bool, hint string) func(network, address string, c syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("%w: cannot parse dial address %q: %w", ErrRefusedAddress, address, err)
		}
		switch v := ClassifyAddr(ap.Addr()); {
		case v.Class == AddrOpen, v.Class == AddrLocal && allowPrivate:
			return nil
		case v.Class == AddrLocal:
			return fmt.Errorf("%w: %s is %s; set %s to allow it", ErrRefusedAddress, address, v.Why, hint)
		default:
			return fmt.Errorf("%w: %s is %s, never a fetch target (refused even with %s)", ErrRefusedAddress, address, v.Why, hint)
		}
	}
}

// metadataAddrs are cloud metadata and credential services. Those in
// 169.254.0.0/16 are link-local anyway, but are listed so that they stay
// refused when private addresses are allowed; the others sit in ranges
// (ULA, CGNAT, even public space) that are not refused as a whole.
var metadataAddrs = map[netip.Addr]string{
	netip.MustParseAddr("169.254.169.254"): "the instance metadata address (AWS, GCP, Azure, Oracle, OpenStack and others)",
	netip.MustParseAddr("169.254.170.2"):   "the AWS ECS task metadata and credentials address",
	netip.MustParseAddr("169.254.170.23"):  "the EKS Pod Identity agent address",
	netip.MustParseAddr("fd00:ec2::254"):   "the AWS EC2 IPv6 metadata address",
	netip.MustParseAddr("fd00:ec2::23"):    "the EKS Pod Identity agent IPv6 address",
	netip.MustParseAddr("fd20:ce::254"):    "the GCP IPv6 metadata address",
	netip.MustParseAddr("fd00:42::42"):     "a metadata service IPv6 address",
	netip.MustParseAddr("192.0.0.192"):     "the Oracle Cloud metadata address",
	netip.MustParseAddr("168.63.129.16"):   "the Azure WireServer address",
	netip.MustParseAddr("100.100.100.200"): "the Alibaba Cloud metadata address",
}

// Prefixes whose addresses carry an IPv4 address a translator, tunnel or
// dual stack delivers to. Judging only the IPv6 form would let
// 64:ff9b::a9fe:a9fe reach 169.254.169.254 through a NAT64 gateway.
var (
	ipv4Compatible  = netip.MustParsePrefix("::/96")           // RFC 4291 §2.5.5.1, deprecated, still routed by some stacks
	ipv4Translated  = netip.MustParsePrefix("::ffff:0:0:0/96") // RFC 2765 SIIT
	nat64WellKnown  = netip.MustParsePrefix("64:ff9b::/96")    // RFC 6052
	nat64LocalUse   = netip.MustParsePrefix("64:ff9b:1::/48")  // RFC 8215
	sixToFour       = netip.MustParsePrefix("2002::/16")       // RFC 3056
	teredo          = netip.MustParsePrefix("2001::/32")       // RFC 4380
	ipv4ThisNetwork = netip.MustParsePrefix("0.0.0.0/8")       // RFC 1122 §3.2.1.3
	ipv4Broadcast   = netip.MustParseAddr("255.255.255.255")
)

// embeddedIPv4 is one IPv4 address decoded from an IPv6 one.
type embeddedIPv4 struct {
	addr netip.Addr
	how  string
}

// embeddedIPv4s decodes the IPv4 addresses a carries: one for most
// forms, two for Teredo (server and client), and one per RFC 6052 layout
// for the local-use NAT64 prefix, whose prefix length the operator
// chooses (any of them may be the one in use, so all are judged).
func embeddedIPv4s(a netip.Addr) []embeddedIPv4 {
	if !a.Is6() || a.Is4In6() {
		return nil
	}
	b := a.As16()
	v4 := func(p0, p1, p2, p3 byte) netip.Addr { return netip.AddrFrom4([4]byte{p0, p1, p2, p3}) }
	last := v4(b[12], b[13], b[14], b[15])
	switch {
	case nat64WellKnown.Contains(a):
		return []embeddedIPv4{{last, "NAT64 64:ff9b::/96"}}
	case nat64LocalUse.Contains(a):
		// RFC 6052 §2.2: bits 64-71 (byte 8) are skipped.
		return []embeddedIPv4{
			{v4(b[6], b[7], b[9], b[10]), "NAT64 64:ff9b:1::/48 with a /48 prefix"},
			{v4(b[7], b[9], b[10], b[11]), "NAT64 64:ff9b:1::/48 with a /56 prefix"},
			{v4(b[9], b[10], b[11], b[12]), "NAT64 64:ff9b:1::/48 with a /64 prefix"},
			{last, "NAT64 64:ff9b:1::/48 with a /96 prefix"},
		}
	case sixToFour.Contains(a):
		return []embeddedIPv4{{v4(b[2], b[3], b[4], b[5]), "6to4 2002::/16"}}
	case teredo.Contains(a):
		return []embeddedIPv4{
			{v4(b[4], b[5], b[6], b[7]), "the Teredo server of 2001::/32"},
			{v4(^b[12], ^b[13], ^b[14], ^b[15]), "the Teredo client of 2001::/32"},
		}
	case ipv4Translated.Contains(a):
		return []embeddedIPv4{{last, "IPv4-translated ::ffff:0:0:0/96"}}
	case ipv4Compatible.Contains(a) && a != netip.IPv6Unspecified() && a != netip.IPv6Loopback():
		return []embeddedIPv4{{last, "IPv4-compatible ::/96"}}
	}
	return nil
}

// Classify judges a dial address. An IPv6 address that carries an IPv4
// address is judged by the strictest of its own class and those of the
// addresses it carries, so every spelling of 169.254.169.254 is refused
// alike.
func ClassifyAddr(a netip.Addr) AddrVerdict {
	a = a.WithZone("").Unmap()
	if a.Is4() {
		return classifyIPv4(a)
	}
	v := classifyIPv6(a)
	for _, e := range embeddedIPv4s(a) {
		if ev := classifyIPv4(e.addr); ev.Class > v.Class {
			v = AddrVerdict{ev.Class, fmt.Sprintf("%s (%s, carried as %s)", ev.Why, e.addr, e.how)}
		}
	}
	return v
}

func classifyIPv4(a netip.Addr) AddrVerdict {
	if why, ok := metadataAddrs[a]; ok {
		return AddrVerdict{AddrNever, why}
	}
	switch {
	case ipv4ThisNetwork.Contains(a):
		// 0.0.0.0 reaches the local host on Linux; the rest of 0/8 is
		// "this network", never a remote peer.
		return AddrVerdict{AddrLocal, "an unspecified or this-network (0.0.0.0/8) address"}
	case a.IsLoopback():
		return AddrVerdict{AddrLocal, "a loopback address"}
	case a.IsLinkLocalUnicast():
		return AddrVerdict{AddrLocal, "a link-local address"}
	case a.IsMulticast(), a == ipv4Broadcast:
		// Never a TCP peer; refusing costs nothing.
		return AddrVerdict{AddrNever, "a multicast or broadcast address"}
	}
	return AddrVerdict{AddrOpen, ""}
}

func classifyIPv6(a netip.Addr) AddrVerdict {
	if why, ok := metadataAddrs[a]; ok {
		return AddrVerdict{AddrNever, why}
	}
	switch {
	case a.IsUnspecified():
		return AddrVerdict{AddrLocal, "an unspecified address"}
	case a.IsLoopback():
		return AddrVerdict{AddrLocal, "a loopback address"}
	case a.IsLinkLocalUnicast():
		return AddrVerdict{AddrLocal, "a link-local address"}
	case a.IsMulticast():
		return AddrVerdict{AddrNever, "a multicast address"}
	}
	return AddrVerdict{AddrOpen, ""}
}
