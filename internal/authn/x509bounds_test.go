package authn

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// oddModulus is a random odd number of bits bits: the shape of an RSA
// modulus, enough for checks that never use it.
func oddModulus(t *testing.T, bits int) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), uint(bits-1)))
	require.NoError(t, err)
	n.SetBit(n, bits-1, 1)
	n.SetBit(n, 0, 1)
	return n
}

func TestCheckKey(t *testing.T) {
	ec := func(c elliptic.Curve) *ecdsa.PublicKey {
		k, err := ecdsa.GenerateKey(c, rand.Reader)
		require.NoError(t, err)
		return &k.PublicKey
	}
	tests := []struct {
		name    string
		pub     any
		wantErr string
	}{
		{"RSA 2048", &rsa.PublicKey{N: oddModulus(t, 2048), E: 65537}, ""},
		{"RSA 3072", &rsa.PublicKey{N: oddModulus(t, 3072), E: 65537}, ""},
		{"RSA 4096", &rsa.PublicKey{N: oddModulus(t, 4096), E: 65537}, ""},
		{"RSA 1024", &rsa.PublicKey{N: oddModulus(t, 1024), E: 65537}, "1024 bits"},
		{"RSA 4097", &rsa.PublicKey{N: oddModulus(t, 4097), E: 65537}, "4097 bits"},
		{"RSA 8192", &rsa.PublicKey{N: oddModulus(t, 8192), E: 65537}, "8192 bits"},
		{"RSA exponent 3", &rsa.PublicKey{N: oddModulus(t, 2048), E: 3}, "exponent 3"},
		{"RSA large exponent", &rsa.PublicKey{N: oddModulus(t, 2048), E: 1<<31 - 1}, "exponent 2147483647"},
		{"P-256", ec(elliptic.P256()), ""},
		{"P-384", ec(elliptic.P384()), ""},
		{"P-521", ec(elliptic.P521()), ""},
		{"P-224", ec(elliptic.P224()), "curve"},
		{"Ed25519", testca.NewKey(t, testca.Ed25519).Public(), ""},
		{"DSA-like unknown", struct{}{}, "not accepted"},
		{"nil", nil, "not accepted"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkKey(tt.pub)
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

func TestCheckChainBounds(t *testing.T) {
	good := testca.NewKey(t, testca.ECP256).Public()
	cert := func(subject string, isCA bool, pub any) *x509.Certificate {
		return &x509.Certificate{RawSubject: []byte(subject), IsCA: isCA, BasicConstraintsValid: isCA, PublicKey: pub}
	}
	big := &rsa.PublicKey{N: oddModulus(t, 8192), E: 1<<31 - 1}
	tests := []struct {
		name    string
		chain   []*x509.Certificate
		wantErr string
	}{
		{"leaf alone", []*x509.Certificate{cert("leaf", false, good)}, ""},
		{"leaf and intermediates", []*x509.Certificate{cert("leaf", false, good), cert("i1", true, good), cert("i2", true, good)}, ""},
		{"intermediate not a CA", []*x509.Certificate{cert("leaf", false, good), cert("i1", false, good)}, "not a CA"},
		{"intermediate without basic constraints", []*x509.Certificate{cert("leaf", false, good), {RawSubject: []byte("i1"), IsCA: true, PublicKey: good}}, "not a CA"},
		{"duplicate subjects", []*x509.Certificate{cert("leaf", false, good), cert("i", true, good), cert("i", true, good)}, "certificates 1 and 2 have the same subject"},
		{"leaf key too big", []*x509.Certificate{cert("leaf", false, big)}, "certificate 0"},
		{"intermediate key too big", []*x509.Certificate{cert("leaf", false, good), cert("i", true, big)}, "certificate 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkChainBounds(tt.chain)
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, errChainBounds)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

// expensiveChain is the chain of issue 14 item 2: an X509-SVID of the
// local trust domain whose issuer is one of seven CA certificates that
// share one subject and carry an RSA-8192 key with a huge public
// exponent. No signature in it is valid: Go's chain builder spends an
// expensive RSA verification on each candidate all the same.
func expensiveChain(t *testing.T, id spiffeid.ID) []*x509.Certificate {
	t.Helper()
	signer := testca.NewKey(t, testca.ECP256)
	pub := &rsa.PublicKey{N: oddModulus(t, 8192), E: 1<<31 - 1}
	subject := pkix.Name{CommonName: "one subject"}
	now := time.Now().Add(-time.Minute)
	var cas []*x509.Certificate
	for range 7 {
		tmpl := &x509.Certificate{
			SerialNumber: randomSerial(t), Subject: subject, NotBefore: now, NotAfter: now.Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		}
		self := &x509.Certificate{Subject: subject, SubjectKeyId: []byte{1}}
		cas = append(cas, testca.Sign(t, tmpl, self, pub, signer))
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: randomSerial(t), Subject: pkix.Name{CommonName: "leaf"}, NotBefore: now, NotAfter: now.Add(time.Hour),
		URIs: []*url.URL{id.URL()}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	leaf := testca.Sign(t, leafTmpl, &x509.Certificate{Subject: subject, SubjectKeyId: []byte{1}}, signer.Public(), signer)
	return append([]*x509.Certificate{leaf}, cas...)
}

// The crafted chain is refused before any signature is checked.
func TestX509SVIDRefusesExpensiveChain(t *testing.T) {
	local := testca.New(t, "example.org")
	a := NewX509SVID(localTD, local.Bundle().X509Bundle(), nil)
	verified := countVerify(a)
	chain := expensiveChain(t, workloadID)
	for range 3 {
		_, err := a.Authenticate(context.Background(), Request{PeerCertificates: chain, Peer: "192.0.2.1:1"})
		require.ErrorIs(t, err, ErrInvalidCredentials)
		assert.Contains(t, err.Error(), "outside the accepted bounds")
	}
	assert.Zero(t, verified.Load(), "no signature checked")
	assert.Equal(t, 3.0, testutil.ToFloat64(a.m.results.WithLabelValues(x509OutOfBounds)))
}

// blockingVerify makes verifications wait for release, and reports each
// start on started.
func blockingVerify(a *X509SVID) (started chan struct{}, release chan struct{}) {
	started, release = make(chan struct{}, 64), make(chan struct{})
	inner := a.verify
	a.verify = func(certs []*x509.Certificate, b x509bundle.Source, usage x509.ExtKeyUsage, opts ...x509svid.VerifyOption) (spiffeid.ID, [][]*x509.Certificate, error) {
		started <- struct{}{}
		<-release
		return inner(certs, b, usage, opts...)
	}
	return started, release
}

// Verifications in flight are bounded per client address (IPv4 address,
// IPv6 address) and in total: beyond, a call is refused at once with
// ErrUnavailable and counted, while a caller whose chain is cached never
// waits for a slot.
func TestX509SVIDVerificationGate(t *testing.T) {
	local := testca.New(t, "example.org")
	cached, _ := local.Issue(t, spiffeIDFor("cached"))
	var leaves []*x509.Certificate
	for i := range 6 {
		l, _ := local.Issue(t, spiffeid.RequireFromSegments(localTD, "w", string(rune('a'+i))))
		leaves = append(leaves, l)
	}
	reg := prometheus.NewRegistry()
	a := NewX509SVID(localTD, local.Bundle().X509Bundle(), nil, WithMaxVerifications(2, 3))
	require.NoError(t, a.Register(reg))
	_, err := a.Authenticate(context.Background(), Request{PeerCertificates: []*x509.Certificate{cached}, Peer: "192.0.2.1:1"})
	require.NoError(t, err)
	started, release := blockingVerify(a)

	var wg sync.WaitGroup
	auth := func(leaf *x509.Certificate, peer string) {
		wg.Go(func() {
			_, err := a.Authenticate(context.Background(), Request{PeerCertificates: []*x509.Certificate{leaf}, Peer: peer})
			assert.NoError(t, err)
		})
		<-started
	}
	// Two from one address, other ports: its share.
	auth(leaves[0], "192.0.2.1:1000")
	auth(leaves[1], "192.0.2.1:1001")
	_, err = a.Authenticate(context.Background(), Request{PeerCertificates: []*x509.Certificate{leaves[2]}, Peer: "192.0.2.1:1002"})
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.throttled.WithLabelValues(scopePeer)))

	// Another address has room of its own, until the global bound: three
	// in flight, so the next from an address with room is refused too.
	auth(leaves[3], "[2001:db8:1:2::1]:443")
	_, err = a.Authenticate(context.Background(), Request{PeerCertificates: []*x509.Certificate{leaves[4]}, Peer: "[2001:db8:1:2:ffff::9]:443"})
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.throttled.WithLabelValues(scopeGlobal)))
	assert.Equal(t, 1, a.gate.inFlight("2001:db8:1:2::1"), "an IPv6 address is one client (pods of a node share a /64)")

	// The cached caller passes while every slot is taken.
	id, err := a.Authenticate(context.Background(), Request{PeerCertificates: []*x509.Certificate{cached}, Peer: "192.0.2.1:5"})
	require.NoError(t, err)
	assert.Equal(t, spiffeIDFor("cached"), id.ID)

	close(release)
	wg.Wait()
	_, err = a.Authenticate(context.Background(), Request{PeerCertificates: []*x509.Certificate{leaves[5]}, Peer: "192.0.2.1:1002"})
	require.NoError(t, err, "room again")
	assert.Equal(t, 2.0, testutil.ToFloat64(a.m.results.WithLabelValues(x509Throttled)))
	assert.Zero(t, a.gate.inFlight("192.0.2.1"))
}

func TestPeerKey(t *testing.T) {
	tests := []struct{ addr, want string }{
		{"192.0.2.1:443", "192.0.2.1"},
		{"192.0.2.1", "192.0.2.1"},
		{"[::ffff:192.0.2.1]:443", "192.0.2.1"},
		{"[2001:db8:1:2:3:4:5:6]:443", "2001:db8:1:2:3:4:5:6"},
		{"[2001:db8:1:2::ffff]:1", "2001:db8:1:2::ffff"},
		{"[fe80::1%eth0]:1", "fe80::1"},
		{"bufconn", "bufconn"},
		{"", ""},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, peerKey(tt.addr), tt.addr)
	}
}

// A replayed bad chain costs one verification per bundle and TTL; the
// cache is bounded and forgets the least recently used failure first.
func TestX509SVIDFailureCache(t *testing.T) {
	local := testca.New(t, "example.org")
	rogue := testca.New(t, "example.org") // not in the roots
	var bad [][]*x509.Certificate
	for i := range 3 {
		l, _ := rogue.Issue(t, spiffeid.RequireFromSegments(localTD, "bad", string(rune('a'+i))))
		bad = append(bad, []*x509.Certificate{l})
	}
	clk := clocktesting.NewFakePassiveClock(time.Now())
	a := NewX509SVID(localTD, local.Bundle().X509Bundle(), clk, WithFailureCache(2, 30*time.Second))
	verified := countVerify(a)
	auth := func(chain []*x509.Certificate) {
		t.Helper()
		_, err := a.Authenticate(context.Background(), Request{PeerCertificates: chain})
		require.ErrorIs(t, err, ErrInvalidCredentials)
	}
	for range 5 {
		auth(bad[0])
	}
	assert.EqualValues(t, 1, verified.Load(), "replays are map lookups")
	assert.Equal(t, 4.0, testutil.ToFloat64(a.m.results.WithLabelValues(x509FailedCached)))

	clk.SetTime(clk.Now().Add(30 * time.Second))
	auth(bad[0])
	assert.EqualValues(t, 2, verified.Load(), "verified again after the TTL")

	auth(bad[1])
	auth(bad[2]) // evicts bad[0]
	assert.Equal(t, 2, a.failures.len())
	auth(bad[0])
	assert.EqualValues(t, 5, verified.Load(), "the evicted failure is verified again")

	off := NewX509SVID(localTD, local.Bundle().X509Bundle(), clk, WithFailureCache(0, 0))
	assert.Nil(t, off.failures)
}

// An IPv6 host that opens each connection from another address of its
// /64 gets each address's share only up to the network's (netShare
// addresses' worth); another network, and IPv4 callers, are unaffected.
func TestPeerGateIPv6Network(t *testing.T) {
	g := newPeerGate(1, 100)
	addr := func(net string, i int) string { return fmt.Sprintf("[%s::%x]:443", net, i+1) }
	for i := range netShare {
		ok, _ := g.acquire(addr("2001:db8:1:2", i))
		require.True(t, ok, "address %d of the /64", i)
	}
	ok, scope := g.acquire(addr("2001:db8:1:2", netShare))
	assert.False(t, ok, "the /64's share is spent")
	assert.Equal(t, scopePeer, scope)
	ok, _ = g.acquire(addr("2001:db8:9:9", 0))
	assert.True(t, ok, "another /64 has its own")
	ok, _ = g.acquire("192.0.2.7:1")
	assert.True(t, ok)

	g.release(addr("2001:db8:1:2", 0))
	ok, _ = g.acquire(addr("2001:db8:1:2", netShare))
	assert.True(t, ok, "room again in the /64")
	assert.Equal(t, "2001:db8:1:2::/64", peerNet(addr("2001:db8:1:2", 3)))
	assert.Empty(t, peerNet("192.0.2.7:1"))
	assert.Empty(t, peerNet("bufconn"))
}
