package connlimit

import (
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSourceOf(t *testing.T) {
	tests := []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 5}, "192.0.2.1"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.1"), Port: 5}, "192.0.2.1"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:3:4:5:6"), Port: 5}, "2001:db8:1:2::/64"},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 5, Zone: "eth0"}, "fe80::/64"},
		{pipeAddr("[2001:db8::1]:443"), "2001:db8::/64"},
		{pipeAddr("192.0.2.9:1"), "192.0.2.9"},
		{pipeAddr("@"), "@"},
		{pipeAddr("192.0.2.9"), "192.0.2.9"}, // no port: not parsed, its own key
		{(*net.TCPAddr)(nil), "<nil>"},
		{nil, ""},
	}
	for _, tt := range tests {
		name := "nil"
		if tt.addr != nil {
			name = tt.addr.String()
		}
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tt.want, sourceOf(tt.addr))
		})
	}
}

// FuzzSourceOf checks that an address written as text (a wrapper's
// RemoteAddr that is not a *net.TCPAddr) counts under the source its
// *net.TCPAddr would, that an IPv6 source is the /64 holding the address,
// and that nothing panics.
func FuzzSourceOf(f *testing.F) {
	for _, s := range []string{"192.0.2.1:443", "[2001:db8::1]:1", "[::ffff:10.0.0.1]:80", "[fe80::1%eth0]:22", "@", "", "[::]:0", "1.2.3.4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := sourceOf(pipeAddr(s))
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			if got != s {
				t.Fatalf("sourceOf(%q) = %q, want the text itself", s, got)
			}
			return
		}
		ip := ap.Addr().Unmap().WithZone("")
		if via := sourceOf(net.TCPAddrFromAddrPort(ap)); via != got {
			t.Fatalf("sourceOf(%q): %q as text, %q as *net.TCPAddr", s, got, via)
		}
		if ip.Is4() {
			if got != ip.String() {
				t.Fatalf("sourceOf(%q) = %q, want %s", s, got, ip)
			}
			return
		}
		p, err := netip.ParsePrefix(got)
		if err != nil || p.Bits() != 64 || !p.Contains(ip) || p.Masked() != p {
			t.Fatalf("sourceOf(%q) = %q, want the /64 holding %s", s, got, ip)
		}
	})
}
