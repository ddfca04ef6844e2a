package federation

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClassifyAddr(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addr  string
		class addrClass
		why   string // part of the reason, when refused
	}{
		// Loopback, unspecified, this-network, link-local: opened by
		// AllowPrivate.
		{"127.0.0.1", addrLocal, "loopback"},
		{"127.1.2.3", addrLocal, "loopback"},
		{"::1", addrLocal, "loopback"},
		{"::ffff:127.0.0.1", addrLocal, "loopback"},
		{"0.0.0.0", addrLocal, "0.0.0.0/8"},
		{"0.1.2.3", addrLocal, "0.0.0.0/8"},
		{"::", addrLocal, "unspecified"},
		{"::ffff:0.0.0.0", addrLocal, "0.0.0.0/8"},
		{"169.254.1.1", addrLocal, "link-local"},
		{"fe80::1", addrLocal, "link-local"},
		{"fe80::1%eth0", addrLocal, "link-local"},
		{"febf::1", addrLocal, "link-local"},

		// Metadata and credential services: refused always.
		{"169.254.169.254", addrNever, "instance metadata"},
		{"::ffff:169.254.169.254", addrNever, "instance metadata"},
		{"169.254.170.2", addrNever, "ECS"},
		{"169.254.170.23", addrNever, "Pod Identity"},
		{"fd20:ce::254", addrNever, "GCP"},
		{"fd00:ec2::23", addrNever, "Pod Identity"},
		{"fd00:ec2::254", addrNever, "EC2"},
		{"192.0.0.192", addrNever, "Oracle"},
		{"fd00:42::42", addrNever, "metadata"},
		{"168.63.129.16", addrNever, "WireServer"},
		{"::ffff:168.63.129.16", addrNever, "WireServer"},
		{"100.100.100.200", addrNever, "Alibaba"},

		// 169.254.169.254 spelled as IPv6.
		{"64:ff9b::a9fe:a9fe", addrNever, "carried as NAT64 64:ff9b::/96"},
		{"64:ff9b::169.254.169.254", addrNever, "instance metadata"},
		{"64:ff9b:1::a9fe:a9fe", addrNever, "/96 prefix"},
		{"64:ff9b:1:a9fe:a9:fe00::", addrNever, "/48 prefix"},
		{"64:ff9b:1:a9:fe:a9fe::", addrNever, "/56 prefix"},
		{"64:ff9b:1:0:a9:fea9:fe00:0", addrNever, "/64 prefix"},
		{"::a9fe:a9fe", addrNever, "IPv4-compatible"},
		{"::169.254.169.254", addrNever, "IPv4-compatible"},
		{"::ffff:0:a9fe:a9fe", addrNever, "IPv4-translated"},
		{"2002:a9fe:a9fe::", addrNever, "6to4"},
		{"2002:a9fe:a9fe:1:2:3:4:5", addrNever, "6to4"},
		// Teredo: client 169.254.169.254 is stored inverted (56.1.56.1).
		{"2001:0:4136:e378:8000:63bf:5601:5601", addrNever, "Teredo client"},
		{"2001:0:a9fe:a9fe::1", addrNever, "Teredo server"},
		{"64:ff9b::a83f:8110", addrNever, "WireServer"},

		// Other embedded addresses are judged by the IPv4 rules too.
		{"64:ff9b::7f00:1", addrLocal, "loopback address (127.0.0.1, carried as NAT64"},
		{"2002:7f00:1::", addrLocal, "loopback"},
		{"::7f00:1", addrLocal, "loopback"},
		{"64:ff9b::a9fe:101", addrLocal, "link-local"},
		{"2002::", addrLocal, "0.0.0.0/8"},
		{"64:ff9b::e000:1", addrNever, "multicast"},

		// Multicast and broadcast.
		{"224.0.0.1", addrNever, "multicast"},
		{"255.255.255.255", addrNever, "broadcast"},
		{"ff02::1", addrNever, "multicast"},

		// Controls that must pass: public addresses in every spelling,
		// and private ranges (in-cluster and same-VPC federation).
		{"8.8.8.8", addrOpen, ""},
		{"1.1.1.1", addrOpen, ""},
		{"::ffff:8.8.8.8", addrOpen, ""},
		{"2001:4860:4860::8888", addrOpen, ""},
		{"2606:4700:4700::1111", addrOpen, ""},
		{"2001:db8::1", addrOpen, ""},
		{"64:ff9b::808:808", addrOpen, ""},
		{"2002:808:808::1", addrOpen, ""},
		{"2001:0:808:808::f7f7:f7f7", addrOpen, ""},
		{"10.0.0.1", addrOpen, ""},
		{"192.168.1.1", addrOpen, ""},
		{"100.64.0.1", addrOpen, ""},
		{"168.63.129.17", addrOpen, ""},
		{"fd00:ec2::1", addrOpen, ""},
		{"fec0::1", addrOpen, ""},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			got := classifyAddr(netip.MustParseAddr(tt.addr))
			assert.Equal(t, tt.class, got.class, "classifyAddr(%s) = %+v", tt.addr, got)
			if tt.class == addrOpen {
				assert.Empty(t, got.why)
			} else {
				assert.Contains(t, got.why, tt.why)
			}
		})
	}
}

// The dialer's verdict: AllowPrivate opens loopback but never a metadata
// address, in any spelling.
func TestControlDial(t *testing.T) {
	t.Parallel()
	strict := &Fetcher{cfg: FetcherConfig{}}
	lab := &Fetcher{cfg: FetcherConfig{AllowPrivate: true}}
	tests := []struct {
		address      string
		strict, lab  bool // allowed
		strictReason string
	}{
		{"8.8.8.8:443", true, true, ""},
		{"[2001:4860:4860::8888]:443", true, true, ""},
		{"127.0.0.1:443", false, true, "set --federation-allow-private"},
		{"[::1]:443", false, true, "set --federation-allow-private"},
		{"169.254.1.1:443", false, true, "set --federation-allow-private"},
		{"169.254.169.254:80", false, false, "refused even with --federation-allow-private"},
		{"[64:ff9b::a9fe:a9fe]:443", false, false, "refused even with --federation-allow-private"},
		{"[fd20:ce::254]:443", false, false, "refused even with --federation-allow-private"},
		{"168.63.129.16:443", false, false, "refused even with --federation-allow-private"},
		{"not-an-address", false, false, "cannot parse"},
	}
	for _, tt := range tests {
		t.Run(tt.address, func(t *testing.T) {
			err := strict.controlDial("tcp", tt.address, nil)
			if tt.strict {
				assert.NoError(t, err)
			} else {
				require.ErrorIs(t, err, ErrRefusedAddress)
				assert.Contains(t, err.Error(), tt.strictReason)
			}
			err = lab.controlDial("tcp", tt.address, nil)
			if tt.lab {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, ErrRefusedAddress)
			}
		})
	}
}

// FuzzClassifyAddr: the classifier never panics, and an address it
// leaves open carries no IPv4 address that is refused, however that
// IPv4 address is embedded. The decoding here is written out separately
// from embeddedIPv4s, so a layout dropped there is caught.
func FuzzClassifyAddr(f *testing.F) {
	for _, s := range []string{"64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::", "::a9fe:a9fe", "2001:0:4136:e378:8000:63bf:5601:5601",
		"::ffff:169.254.169.254", "2001:4860:4860::8888", "fd20:ce::254", "64:ff9b:1::a9fe:a9fe"} {
		b := netip.MustParseAddr(s).As16()
		f.Add(b[:])
	}
	f.Add([]byte{169, 254, 169, 254})
	f.Fuzz(func(t *testing.T, raw []byte) {
		a, ok := netip.AddrFromSlice(raw)
		if !ok {
			return
		}
		v := classifyAddr(a)
		if v.class != addrOpen {
			if v.why == "" {
				t.Fatalf("%s refused without a reason", a)
			}
			return
		}
		if !a.Is6() || a.Is4In6() {
			return
		}
		b := a.As16()
		at := func(i, j, k, l int) netip.Addr { return netip.AddrFrom4([4]byte{b[i], b[j], b[k], b[l]}) }
		var carried []netip.Addr
		switch {
		case b[0] == 0x20 && b[1] == 0x02: // 6to4
			carried = append(carried, at(2, 3, 4, 5))
		case b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0: // Teredo
			carried = append(carried, at(4, 5, 6, 7),
				netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]}))
		case b[0] == 0 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b && b[4] == 0 && b[5] == 1: // 64:ff9b:1::/48
			carried = append(carried, at(6, 7, 9, 10), at(7, 9, 10, 11), at(9, 10, 11, 12), at(12, 13, 14, 15))
		case allZero(b[:12]) && !(allZero(b[12:15]) && b[15] <= 1):
			carried = append(carried, at(12, 13, 14, 15)) // IPv4-compatible, not :: or ::1
		case b[0] == 0 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b && allZero(b[4:12]), // 64:ff9b::/96
			allZero(b[:8]) && b[8] == 0xff && b[9] == 0xff && b[10] == 0 && b[11] == 0: // ::ffff:0:0:0/96
			carried = append(carried, at(12, 13, 14, 15))
		}
		for _, c := range carried {
			if cv := classifyAddr(c); cv.class != addrOpen {
				t.Fatalf("%s is open but carries %s, which is %s", a, c, cv.why)
			}
		}
	})
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// A lab that sets AllowPrivate still cannot be pointed at a metadata
// service, by URL or by any IPv6 spelling of it; the dialer refuses before
// connect(2), so no packet leaves.
func TestFetchRefusesMetadataEvenWithAllowPrivate(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	for _, host := range []string{"169.254.169.254", "[64:ff9b::a9fe:a9fe]", "[::a9fe:a9fe]", "[2002:a9fe:a9fe::1]", "[fd00:ec2::254]", "168.63.129.16"} {
		t.Run(host, func(t *testing.T) {
			_, err := fx.fetcher(FetcherConfig{AllowPrivate: true}).Fetch(t.Context(), web(t, fetchTD, "https://"+host+"/latest/meta-data/"), "")
			require.ErrorIs(t, err, ErrRefusedAddress)
			assert.Equal(t, "refused_address", FetchErrorKind(err))
			assert.Contains(t, err.Error(), "refused even with --federation-allow-private")
		})
	}
}
