package netutil

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addr  string
		class AddrClass
		why   string // part of the reason, when refused
	}{
		// Loopback, unspecified, this-network, link-local: opened by
		// allowPrivate.
		{"127.0.0.1", AddrLocal, "loopback"},
		{"127.1.2.3", AddrLocal, "loopback"},
		{"::1", AddrLocal, "loopback"},
		{"::ffff:127.0.0.1", AddrLocal, "loopback"},
		{"0.0.0.0", AddrLocal, "0.0.0.0/8"},
		{"0.1.2.3", AddrLocal, "0.0.0.0/8"},
		{"::", AddrLocal, "unspecified"},
		{"::ffff:0.0.0.0", AddrLocal, "0.0.0.0/8"},
		{"169.254.1.1", AddrLocal, "link-local"},
		{"fe80::1", AddrLocal, "link-local"},
		{"fe80::1%eth0", AddrLocal, "link-local"},
		{"febf::1", AddrLocal, "link-local"},

		// Metadata and credential services: refused always.
		{"169.254.169.254", AddrNever, "instance metadata"},
		{"::ffff:169.254.169.254", AddrNever, "instance metadata"},
		{"169.254.170.2", AddrNever, "ECS"},
		{"169.254.170.23", AddrNever, "Pod Identity"},
		{"fd20:ce::254", AddrNever, "GCP"},
		{"fd00:ec2::23", AddrNever, "Pod Identity"},
		{"fd00:ec2::254", AddrNever, "EC2"},
		{"192.0.0.192", AddrNever, "Oracle"},
		{"fd00:42::42", AddrNever, "metadata"},
		{"168.63.129.16", AddrNever, "WireServer"},
		{"::ffff:168.63.129.16", AddrNever, "WireServer"},
		{"100.100.100.200", AddrNever, "Alibaba"},

		// 169.254.169.254 spelled as IPv6.
		{"64:ff9b::a9fe:a9fe", AddrNever, "carried as NAT64 64:ff9b::/96"},
		{"64:ff9b::169.254.169.254", AddrNever, "instance metadata"},
		{"64:ff9b:1::a9fe:a9fe", AddrNever, "/96 prefix"},
		{"64:ff9b:1:a9fe:a9:fe00::", AddrNever, "/48 prefix"},
		{"64:ff9b:1:a9:fe:a9fe::", AddrNever, "/56 prefix"},
		{"64:ff9b:1:0:a9:fea9:fe00:0", AddrNever, "/64 prefix"},
		{"::a9fe:a9fe", AddrNever, "IPv4-compatible"},
		{"::169.254.169.254", AddrNever, "IPv4-compatible"},
		{"::ffff:0:a9fe:a9fe", AddrNever, "IPv4-translated"},
		{"2002:a9fe:a9fe::", AddrNever, "6to4"},
		{"2002:a9fe:a9fe:1:2:3:4:5", AddrNever, "6to4"},
		// Teredo: client 169.254.169.254 is stored inverted (56.1.56.1).
		{"2001:0:4136:e378:8000:63bf:5601:5601", AddrNever, "Teredo client"},
		{"2001:0:a9fe:a9fe::1", AddrNever, "Teredo server"},
		{"64:ff9b::a83f:8110", AddrNever, "WireServer"},

		// Other embedded addresses are judged by the IPv4 rules too.
		{"64:ff9b::7f00:1", AddrLocal, "loopback address (127.0.0.1, carried as NAT64"},
		{"2002:7f00:1::", AddrLocal, "loopback"},
		{"::7f00:1", AddrLocal, "loopback"},
		{"64:ff9b::a9fe:101", AddrLocal, "link-local"},
		{"2002::", AddrLocal, "0.0.0.0/8"},
		{"64:ff9b::e000:1", AddrNever, "multicast"},

		// Multicast and broadcast.
		{"224.0.0.1", AddrNever, "multicast"},
		{"255.255.255.255", AddrNever, "broadcast"},
		{"ff02::1", AddrNever, "multicast"},

		// Controls that must pass: public addresses in every spelling,
		// and private ranges (in-cluster and same-VPC federation).
		{"8.8.8.8", AddrOpen, ""},
		{"1.1.1.1", AddrOpen, ""},
		{"::ffff:8.8.8.8", AddrOpen, ""},
		{"2001:4860:4860::8888", AddrOpen, ""},
		{"2606:4700:4700::1111", AddrOpen, ""},
		{"2001:db8::1", AddrOpen, ""},
		{"64:ff9b::808:808", AddrOpen, ""},
		{"2002:808:808::1", AddrOpen, ""},
		{"2001:0:808:808::f7f7:f7f7", AddrOpen, ""},
		{"10.0.0.1", AddrOpen, ""},
		{"192.168.1.1", AddrOpen, ""},
		{"100.64.0.1", AddrOpen, ""},
		{"168.63.129.17", AddrOpen, ""},
		{"fd00:ec2::1", AddrOpen, ""},
		{"fec0::1", AddrOpen, ""},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			got := ClassifyAddr(netip.MustParseAddr(tt.addr))
			assert.Equal(t, tt.class, got.Class, "Classify(%s) = %+v", tt.addr, got)
			if tt.class == AddrOpen {
				assert.Empty(t, got.Why)
			} else {
				assert.Contains(t, got.Why, tt.why)
			}
		})
	}
}

// FuzzClassify: the classifier never panics, and an address it
// leaves open carries no IPv4 address that is refused, however that
// IPv4 address is embedded. The decoding here is written out separately
// from embeddedIPv4s, so a layout dropped there is caught.
func FuzzClassify(f *testing.F) {
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
		v := ClassifyAddr(a)
		if v.Class != AddrOpen {
			if v.Why == "" {
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
			if cv := ClassifyAddr(c); cv.Class != AddrOpen {
				t.Fatalf("%s is open but carries %s, which is %s", a, c, cv.Why)
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

// Control opens Local addresses only when allowed, never Never ones, and
// says which setting would help.
func TestControl(t *testing.T) {
	t.Parallel()
	const hint = "allowPrivateAddresses"
	strict, lab := DialControl(false, hint), DialControl(true, hint)
	tests := []struct {
		address      string
		strict, lab  bool // allowed
		strictReason string
	}{
		{"8.8.8.8:443", true, true, ""},
		{"10.1.2.3:443", true, true, ""},
		{"[2001:4860:4860::8888]:443", true, true, ""},
		{"127.0.0.1:443", false, true, "is a loopback address; set allowPrivateAddresses to allow it"},
		{"[::1]:443", false, true, "set allowPrivateAddresses"},
		{"[fe80::1%eth0]:443", false, true, "link-local"},
		{"169.254.1.1:443", false, true, "set allowPrivateAddresses"},
		{"169.254.169.254:80", false, false, "refused even with allowPrivateAddresses"},
		{"[64:ff9b::a9fe:a9fe]:443", false, false, "refused even with allowPrivateAddresses"},
		{"[fd20:ce::254]:443", false, false, "refused even with allowPrivateAddresses"},
		{"224.0.0.1:443", false, false, "multicast"},
		{"not-an-address", false, false, "cannot parse"},
	}
	for _, tt := range tests {
		t.Run(tt.address, func(t *testing.T) {
			err := strict("tcp", tt.address, nil)
			if tt.strict {
				assert.NoError(t, err)
			} else {
				require.ErrorIs(t, err, ErrRefusedAddress)
				assert.Contains(t, err.Error(), tt.strictReason)
			}
			err = lab("tcp", tt.address, nil)
			if tt.lab {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, ErrRefusedAddress)
			}
		})
	}
}
