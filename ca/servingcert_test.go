package ca

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/trustbridge/trustbridge/internal/testkit/testlog"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var servingID = spiffeid.RequireFromPath(tdExample, "/trustbridge/ca")

func rootPool(a *Authority) *x509.CertPool {
	pool := x509.NewCertPool()
	for _, r := range a.Bundle().X509Authorities() {
		pool.AddCert(r)
	}
	return pool
}

// parseChain is what a TLS peer receives from GetCertificate.
func parseChain(t *testing.T, c *tls.Certificate) []*x509.Certificate {
	t.Helper()
	certs := make([]*x509.Certificate, 0, len(c.Certificate))
	for _, der := range c.Certificate {
		cert, err := x509.ParseCertificate(der)
		require.NoError(t, err)
		certs = append(certs, cert)
	}
	return certs
}

// assertServingLeaf checks the shape of a serving certificate: an X509-SVID
// for id with exactly the given DNS SANs and nothing else.
func assertServingLeaf(t *testing.T, a *Authority, c *tls.Certificate, id spiffeid.ID, dnsNames []string) {
	t.Helper()
	leaf := c.Leaf
	require.Len(t, leaf.URIs, 1)
	assert.Equal(t, id.String(), leaf.URIs[0].String())
	assert.Equal(t, dnsNames, leaf.DNSNames)
	assert.Empty(t, leaf.IPAddresses)
	assert.Empty(t, leaf.EmailAddresses)
	assert.False(t, leaf.IsCA)
	assert.Equal(t, x509.KeyUsageDigitalSignature, leaf.KeyUsage)
	// X509-SVID §4.4: both purposes, as the serving certificate always had.
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, leaf.ExtKeyUsage)
	assert.Equal(t, []byte{0x30, 0x00}, leaf.RawSubject, "subject must be empty")
	var san *pkix.Extension
	for i, ext := range leaf.Extensions {
		if ext.Id.Equal(asn1.ObjectIdentifier{2, 5, 29, 17}) {
			san = &leaf.Extensions[i]
		}
	}
	require.NotNil(t, san)
	assert.True(t, san.Critical, "SAN extension must be critical with an empty subject")

	// A go-spiffe peer accepts it as an SVID for id, DNS SANs and all.
	got, _, err := x509svid.Verify(parseChain(t, c), a.Bundle(), x509svid.WithTime(leaf.NotBefore.Add(time.Minute)))
	require.NoError(t, err)
	assert.Equal(t, id, got)

	// A host name check passes for every name and fails for any other.
	for _, name := range dnsNames {
		_, err := leaf.Verify(x509.VerifyOptions{
			DNSName: name, Roots: rootPool(a), CurrentTime: leaf.NotBefore.Add(time.Minute),
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		assert.NoError(t, err, name)
	}
	_, err = leaf.Verify(x509.VerifyOptions{DNSName: "other.example.org", Roots: rootPool(a), CurrentTime: leaf.NotBefore.Add(time.Minute)})
	var hostErr x509.HostnameError
	assert.ErrorAs(t, err, &hostErr)
}

func TestServingCertRenewsAtHalfLife(t *testing.T) {
	tests := []struct {
		name string
		opts []ServingCertOption
		want []string
	}{
		{"SPIFFE ID only", nil, nil},
		{"empty WithDNSNames", []ServingCertOption{WithDNSNames()}, nil},
		{"with DNS names", []ServingCertOption{WithDNSNames("istiod.istio-system.svc", "Trustbridge.Example.ORG", "localhost")},
			[]string{"istiod.istio-system.svc", "trustbridge.example.org", "localhost"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			a, err := New(testConfig(t, clk))
			require.NoError(t, err)
			id := spiffeid.RequireFromPath(tdExample, "/trustbridge/bundle-endpoint")
			s, err := a.ServingCert(id, time.Hour, tt.opts...)
			require.NoError(t, err)

			first, err := s.GetCertificate(nil)
			require.NoError(t, err)
			require.Len(t, first.Certificate, 1, "leaf only: peers bring their own roots")
			assertServingLeaf(t, a, first, id, tt.want)
			assert.Equal(t, t0.Add(-backdate), first.Leaf.NotBefore)
			assert.Equal(t, t0.Add(time.Hour), first.Leaf.NotAfter)
			assert.Equal(t, first.Leaf.NotBefore.Add(first.Leaf.NotAfter.Sub(first.Leaf.NotBefore)/2), s.nextRenewal(), "renewal at half life")

			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			require.Eventually(t, clk.HasWaiters, 5*time.Second, time.Millisecond, "Run waits for the renewal time")
			clk.SetTime(s.nextRenewal())
			require.Eventually(t, func() bool { return !s.Leaf().Equal(first.Leaf) }, 5*time.Second, time.Millisecond)
			second, _ := s.GetCertificate(nil)
			assert.NotEqual(t, first.PrivateKey, second.PrivateKey, "a fresh key each time")
			assertServingLeaf(t, a, second, id, tt.want)
			cancel()
			require.NoError(t, <-done)
		})
	}
}

// Istio agents dial the CA by host name and check it against the roots
// they were given: the real handshake, over an in-memory pipe.
func TestServingCertTLSHostName(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	a, err := New(testConfig(t, clk))
	require.NoError(t, err)
	s, err := a.ServingCert(servingID, time.Hour, WithDNSNames("istiod.istio-system.svc", "trustbridge.trustbridge.svc"))
	require.NoError(t, err)

	handshake := func(serverName string) (*tls.ConnectionState, error) {
		cc, sc := net.Pipe()
		defer cc.Close()
		srv := tls.Server(sc, &tls.Config{GetCertificate: s.GetCertificate, MinVersion: tls.VersionTLS12})
		srvDone := make(chan struct{})
		go func() {
			defer close(srvDone)
			_ = srv.Handshake()
			_ = sc.Close()
		}()
		cli := tls.Client(cc, &tls.Config{ServerName: serverName, RootCAs: rootPool(a), Time: clk.Now, MinVersion: tls.VersionTLS12})
		err := cli.Handshake()
		_ = cc.Close()
		<-srvDone
		if err != nil {
			return nil, err
		}
		st := cli.ConnectionState()
		return &st, nil
	}

	for _, name := range []string{"istiod.istio-system.svc", "ISTIOD.istio-system.svc", "trustbridge.trustbridge.svc"} {
		t.Run(name, func(t *testing.T) {
			st, err := handshake(name)
			require.NoError(t, err)
			assert.Equal(t, servingID.String(), st.PeerCertificates[0].URIs[0].String())
		})
	}
	t.Run("unlisted host name", func(t *testing.T) {
		_, err := handshake("istiod.istio-system.svc.cluster.local")
		var verr *tls.CertificateVerificationError
		require.ErrorAs(t, err, &verr)
		var hostErr x509.HostnameError
		assert.ErrorAs(t, verr.Err, &hostErr)
	})
}

func TestServingCertRefusesDNSNames(t *testing.T) {
	long := strings.Repeat("a", 64)
	tooMany := make([]string, maxServingDNSNames+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("n%d.svc", i)
	}
	tests := []struct {
		name string
		opts []ServingCertOption
		msg  string
	}{
		{"empty", []ServingCertOption{WithDNSNames("")}, `DNS name 0 (""): empty`},
		{"wildcard", []ServingCertOption{WithDNSNames("*.istio-system.svc")}, "wildcards are not issued"},
		{"bare star", []ServingCertOption{WithDNSNames("ok.svc", "*")}, `DNS name 1 ("*"): wildcards`},
		{"inner star", []ServingCertOption{WithDNSNames("a.*.svc")}, `character '*' at offset 2`},
		{"trailing dot", []ServingCertOption{WithDNSNames("istiod.istio-system.svc.")}, "trailing dot"},
		{"IPv4", []ServingCertOption{WithDNSNames("10.0.0.1")}, "an IP address"},
		{"IPv6", []ServingCertOption{WithDNSNames("::1")}, "an IP address"},
		{"bracketed IPv6", []ServingCertOption{WithDNSNames("[::1]")}, `character '['`},
		{"short IPv4", []ServingCertOption{WithDNSNames("127.1")}, "last label is all digits"},
		{"all digits", []ServingCertOption{WithDNSNames("12345")}, "last label is all digits"},
		{"underscore", []ServingCertOption{WithDNSNames("my_service.svc")}, `character '_' at offset 2`},
		{"space", []ServingCertOption{WithDNSNames("istiod .svc")}, `character ' '`},
		{"port", []ServingCertOption{WithDNSNames("istiod.svc:15012")}, `character ':'`},
		{"URL", []ServingCertOption{WithDNSNames("https://istiod.svc")}, `character ':'`},
		{"kelvin sign folding to k", []ServingCertOption{WithDNSNames("\u212aube.svc")}, `character '\u212a' at offset 0`},
		{"non-ASCII", []ServingCertOption{WithDNSNames("bücher.example")}, `character '\u00fc'`},
		{"NUL", []ServingCertOption{WithDNSNames("a\x00.svc")}, `character '\x00'`},
		{"leading hyphen", []ServingCertOption{WithDNSNames("-istiod.svc")}, `label "-istiod" starts or ends with '-'`},
		{"trailing hyphen", []ServingCertOption{WithDNSNames("istiod-.svc")}, "starts or ends with '-'"},
		{"empty label", []ServingCertOption{WithDNSNames("istiod..svc")}, "empty label"},
		{"leading dot", []ServingCertOption{WithDNSNames(".svc")}, "empty label"},
		{"label over 63", []ServingCertOption{WithDNSNames(long + ".svc")}, "is 64 characters, at most 63"},
		{"name over 253", []ServingCertOption{WithDNSNames(strings.Repeat("abc.", 63) + "ab")}, "254 characters, at most 253"},
		{"too many", []ServingCertOption{WithDNSNames(tooMany...)}, "33 DNS names, at most 32"},
		{"repeat after lowercasing", []ServingCertOption{WithDNSNames("a.svc", "b.svc", "A.SVC")}, `DNS name 2 ("A.SVC"): repeats DNS name 0`},
		{"option twice", []ServingCertOption{WithDNSNames("a.svc"), WithDNSNames("b.svc")}, "WithDNSNames given more than once"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := New(testConfig(t, clocktesting.NewFakeClock(t0)))
			require.NoError(t, err)
			s, err := a.ServingCert(servingID, time.Hour, tt.opts...)
			require.Error(t, err)
			assert.Nil(t, s)
			assert.True(t, strings.HasPrefix(err.Error(), "ca: serving certificate for spiffe://example.org/trustbridge/ca: "), err.Error())
			assert.Contains(t, err.Error(), tt.msg)
			assert.Zero(t, testutil.CollectAndCount(a.metrics.signings), "nothing signed")
		})
	}
}

func TestCheckDNSNameAccepts(t *testing.T) {
	label63 := strings.Repeat("a", 63)
	name253 := strings.Repeat("abc.", 62) + "abcde"
	require.Len(t, name253, 253)
	for in, want := range map[string]string{
		"localhost":                             "localhost",
		"istiod":                                "istiod",
		"istiod.istio-system.svc":               "istiod.istio-system.svc",
		"IstioD.Istio-System.SVC.cluster.local": "istiod.istio-system.svc.cluster.local",
		"3com.example":                          "3com.example",
		"xn--bcher-kva.example":                 "xn--bcher-kva.example",
		"a--b.example":                          "a--b.example",
		"10.0.0.1a":                             "10.0.0.1a",
		label63 + ".svc":                        label63 + ".svc",
		name253:                                 name253,
	} {
		t.Run(in, func(t *testing.T) {
			got, err := checkDNSName(in)
			require.NoError(t, err)
			assert.Equal(t, want, got)
		})
	}
}

// The workload path stays closed to DNS names, whatever the serving
// certificate of the same Authority carries.
func TestSignStillRefusesDNSNamesNextToServingCert(t *testing.T) {
	a, err := New(testConfig(t, clocktesting.NewFakeClock(t0)))
	require.NoError(t, err)
	_, err = a.ServingCert(servingID, time.Hour, WithDNSNames("istiod.istio-system.svc"))
	require.NoError(t, err)

	for _, id := range []spiffeid.ID{servingID, spiffeid.RequireFromPath(tdExample, "/ns/default/sa/web")} {
		t.Run(id.String(), func(t *testing.T) {
			key := testca.NewKey(t, testca.ECP256)
			der, err := x509.CreateCertificateRequest(nil, &x509.CertificateRequest{
				URIs: []*url.URL{id.URL()}, DNSNames: []string{"istiod.istio-system.svc"},
			}, key)
			require.NoError(t, err)
			csr, err := ParseCSR(der)
			require.NoError(t, err)
			issued, err := a.Sign(csr, id, time.Hour)
			require.ErrorIs(t, err, ErrInvalidCSR)
			assert.Contains(t, err.Error(), `DNS SANs ["istiod.istio-system.svc"] requested`)
			assert.Nil(t, issued)
		})
	}
}

// signServing re-checks what it is given, so that a future caller cannot
// bypass WithDNSNames, and refuses what Sign refuses.
func TestSignServingRefuses(t *testing.T) {
	a, err := New(testConfig(t, clocktesting.NewFakeClock(t0)))
	require.NoError(t, err)
	good := testca.NewKey(t, testca.ECP256).Public()
	tests := []struct {
		name     string
		pub      any
		id       spiffeid.ID
		dnsNames []string
		ttl      time.Duration
		want     error
		msg      string
	}{
		{"unchecked wildcard", good, servingID, []string{"*.svc"}, time.Hour, nil, "wildcards"},
		{"unchecked upper case is lowercased, not refused", good, servingID, []string{"A.SVC"}, time.Hour, nil, ""},
		{"weak key", testca.NewKey(t, testca.RSA1024).Public(), servingID, nil, time.Hour, nil, "serving key: rsa key of 1024 bits"},
		{"other trust domain", good, spiffeid.RequireFromString("spiffe://evil.org/trustbridge/ca"), nil, time.Hour, ErrIdentityNotAllowed, "not in trust domain"},
		{"trust domain ID", good, tdExample.ID(), nil, time.Hour, ErrIdentityNotAllowed, "has no path"},
		{"TTL over the maximum", good, servingID, nil, 3 * time.Hour, ErrInvalidTTL, "exceeds the maximum"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			issued, err := a.signer.signServing(tt.pub, tt.id, tt.dnsNames, tt.ttl)
			if tt.msg == "" {
				require.NoError(t, err)
				assert.Equal(t, []string{"a.svc"}, issued.Leaf.DNSNames)
				return
			}
			require.Error(t, err)
			assert.Nil(t, issued)
			assert.True(t, strings.HasPrefix(err.Error(), "ca: "), err.Error())
			assert.Contains(t, err.Error(), tt.msg)
			if tt.want != nil {
				assert.ErrorIs(t, err, tt.want)
			}
			assert.False(t, errors.Is(err, ErrInvalidCSR), "there is no CSR on this path")
		})
	}
}

// A failed renewal keeps the last good certificate in service, reports the
// error and tries again.
func TestServingCertRenewalFailureKeepsCertificate(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	logs := &testlog.Buffer{}
	cfg := testConfig(t, clk)
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	a, err := New(cfg)
	require.NoError(t, err)
	s, err := a.ServingCert(servingID, time.Hour, WithDNSNames("istiod.istio-system.svc"))
	require.NoError(t, err)
	good, _ := s.GetCertificate(nil)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	require.Eventually(t, clk.HasWaiters, 5*time.Second, time.Millisecond, "Run waits for the renewal time")

	// Past the root's expiry, with no rotation run: nothing can be signed.
	clk.SetTime(t0.Add(48 * time.Hour))
	const failed = "serving certificate renewal failed; retrying"
	require.Eventually(t, func() bool {
		return strings.Count(logs.String(), failed) == 1 && clk.HasWaiters()
	}, 5*time.Second, time.Millisecond)
	got, _ := s.GetCertificate(nil)
	assert.Same(t, good, got, "the last good certificate stays in service")
	assert.Contains(t, logs.String(), "invalid signing material")
	// And it is tried again a little later.
	clk.Step(renewRetry)
	require.Eventually(t, func() bool {
		return strings.Count(logs.String(), failed) == 2 && clk.HasWaiters()
	}, 5*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	err = s.renew()
	require.ErrorIs(t, err, ErrInvalidSigningMaterial)
	assert.Contains(t, err.Error(), "ca: serving certificate for spiffe://example.org/trustbridge/ca: ")
	got, _ = s.GetCertificate(nil)
	assert.Same(t, good, got)
	assert.Equal(t, []string{"istiod.istio-system.svc"}, got.Leaf.DNSNames)
}

func FuzzCheckDNSNames(f *testing.F) {
	for _, seed := range []string{
		"istiod.istio-system.svc", "localhost", "ISTIOD.svc", "*.svc", "a.*.svc", "10.0.0.1", "::1", "127.1",
		"a..b", ".a", "a.", "-a", "a-", "a_b", "\u212aube", "bücher.example", "xn--bcher-kva.example",
		"a,b", "a.svc,A.SVC", strings.Repeat("a", 64), strings.Repeat("a.", 127) + "a", "",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		// Comma-separated, as --grpc-dns-names is.
		names := strings.Split(in, ",")
		out, err := checkDNSNames(names)
		if err != nil {
			if out != nil {
				t.Fatalf("names returned with an error: %v", out)
			}
			return
		}
		if len(out) != len(names) || len(out) > maxServingDNSNames {
			t.Fatalf("%d names in, %d out", len(names), len(out))
		}
		seen := map[string]bool{}
		for i, n := range out {
			if n != strings.ToLower(names[i]) {
				t.Fatalf("%q came out as %q", names[i], n)
			}
			if n == "" || len(n) > maxDNSNameLen || strings.Trim(n, "abcdefghijklmnopqrstuvwxyz0123456789-.") != "" {
				t.Fatalf("accepted %q", n)
			}
			if _, err := netip.ParseAddr(n); err == nil {
				t.Fatalf("accepted IP address %q", n)
			}
			if seen[n] {
				t.Fatalf("accepted repeat %q", n)
			}
			seen[n] = true
			if again, err := checkDNSName(n); err != nil || again != n {
				t.Fatalf("not idempotent on %q: %q, %v", n, again, err)
			}
		}
	})
}
