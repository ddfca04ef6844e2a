package ca

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/asn1"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// mintUnder signs, with the downstream's own key, whatever leaf tmpl
// says: what a downstream that ignores our rules (or whose key was
// stolen) can make under its intermediate.
func mintUnder(t *testing.T, inter *x509.Certificate, key crypto.Signer, now time.Time, tmpl *x509.Certificate) *x509.Certificate {
	t.Helper()
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Minute), now.Add(time.Hour)
	leafKey := testca.NewKey(t, testca.ECP256)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, inter, leafKey.Public(), key)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return leaf
}

// verifyUnder verifies leaf under chain against roots as a client
// checking only the chain (no host name) does: name constraints apply to
// every name of the leaf all the same.
func verifyUnder(leaf *x509.Certificate, chain *UpstreamChain, now time.Time) error {
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range chain.Roots {
		roots.AddCert(r)
	}
	for _, c := range chain.Chain {
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

// Issue 32 item 4: a downstream intermediate vouches for SPIFFE IDs of the
// trust domain and, of DNS names, only the zone of the upstream's workload
// DNS names, none without one; never an IP address.
func TestSignIntermediateNameConstraints(t *testing.T) {
	id, _ := url.Parse("spiffe://example.org/ns/prod/sa/web")
	other, _ := url.Parse("spiffe://other.org/w")
	for _, tc := range []struct {
		zone      string
		extra     []string // DownstreamDNSDomains
		permitted []string // the intermediate's PermittedDNSDomains
		dnsOK     []string // verify
		dnsDeny   []string // fail
	}{
		{zone: "", dnsDeny: []string{"payments.corp.internal", "web.prod.svc.cluster.local", "localhost"}},
		{zone: "svc.cluster.local", permitted: []string{"svc.cluster.local"}, dnsOK: []string{"web.prod.svc.cluster.local", "WEB.PROD.SVC.CLUSTER.LOCAL"},
			dnsDeny: []string{"payments.corp.internal", "svc.cluster.local.evil.example", "xsvc.cluster.local"}},
		{extra: []string{"Region.Corp.Internal"}, permitted: []string{"region.corp.internal"}, dnsOK: []string{"trustbridge.region.corp.internal", "region.corp.internal"},
			dnsDeny: []string{"payments.corp.internal", "web.prod.svc.cluster.local"}},
		{zone: "svc.cluster.local", extra: []string{"region.corp.internal", "svc.cluster.local"}, permitted: []string{"svc.cluster.local", "region.corp.internal"},
			dnsOK:   []string{"web.prod.svc.cluster.local", "trustbridge.region.corp.internal"},
			dnsDeny: []string{"payments.corp.internal", "corp.internal"}},
	} {
		t.Run(fmt.Sprintf("zone %q extra %q", tc.zone, tc.extra), func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			cfg := testConfig(t, clk)
			cfg.SignsIntermediates = true
			cfg.WorkloadDNSZone = tc.zone
			cfg.DownstreamDNSDomains = tc.extra
			top, err := New(cfg)
			require.NoError(t, err)
			key := testca.NewKey(t, testca.ECP256)
			chain, err := top.SignIntermediate(intermediateCSR(t, key, nil), 0)
			require.NoError(t, err)
			inter := chain.Chain[0]
			require.NoError(t, CheckUpstreamChain(t0, tdExample, key.Public(), "test", chain), "a downstream still accepts it")
			assert.True(t, nameConstraintsCritical(t, inter), "name constraints must be critical")
			assert.Equal(t, []string{"example.org"}, inter.PermittedURIDomains)
			if tc.permitted == nil {
				assert.Equal(t, []string{""}, inter.ExcludedDNSDomains, "no DNS name at all")
			} else {
				assert.Empty(t, inter.ExcludedDNSDomains)
			}
			assert.Equal(t, tc.permitted, inter.PermittedDNSDomains, "each domain once, lowercased")
			require.Len(t, inter.ExcludedIPRanges, 2)

			mint := func(tmpl *x509.Certificate) *x509.Certificate { return mintUnder(t, inter, key, t0, tmpl) }
			assert.NoError(t, verifyUnder(mint(&x509.Certificate{URIs: []*url.URL{id}}), chain, t0), "a SPIFFE ID only")
			assert.Error(t, verifyUnder(mint(&x509.Certificate{URIs: []*url.URL{other}}), chain, t0), "another trust domain")
			for _, ip := range []net.IP{net.IPv4(10, 0, 0, 1), net.ParseIP("fe80::1"), net.IPv4(127, 0, 0, 1).To4()} {
				err := verifyUnder(mint(&x509.Certificate{URIs: []*url.URL{id}, IPAddresses: []net.IP{ip}}), chain, t0)
				assert.ErrorContains(t, err, "not authorized to sign for this name", "IP %s", ip)
			}
			for _, name := range tc.dnsDeny {
				err := verifyUnder(mint(&x509.Certificate{DNSNames: []string{name}}), chain, t0)
				assert.ErrorContains(t, err, "not authorized to sign for this name", "DNS name %s", name)
				err = verifyUnder(mint(&x509.Certificate{URIs: []*url.URL{id}, DNSNames: []string{name}}), chain, t0)
				assert.Error(t, err, "DNS name %s beside a SPIFFE ID", name)
			}
			for _, name := range tc.dnsOK {
				assert.NoError(t, verifyUnder(mint(&x509.Certificate{URIs: []*url.URL{id}, DNSNames: []string{name}}), chain, t0), "DNS name %s", name)
			}
		})
	}
}

func nameConstraintsCritical(t *testing.T, c *x509.Certificate) bool {
	t.Helper()
	for _, e := range c.Extensions {
		if e.Id.Equal(asn1.ObjectIdentifier{2, 5, 29, 30}) {
			return e.Critical
		}
	}
	t.Fatal("no name constraints extension")
	return false
}

// A downstream whose workload DNS names and serving names lie in the
// upstream's zone issues them under its intermediate, and they verify
// against the upstream's roots; its SPIFFE-only leaves too. One whose names
// the upstream's constraints refuse refuses the intermediate, saying which
// flag to change, and cannot sign rather than sign what would not verify.
func TestDownstreamNamesMeetUpstreamConstraints(t *testing.T) {
	newTop := func(t *testing.T, clk *clocktesting.FakeClock, zone string) *Authority {
		cfg := testConfig(t, clk)
		cfg.SignsIntermediates = true
		cfg.WorkloadDNSZone = zone
		top, err := New(cfg)
		require.NoError(t, err)
		return top
	}
	newMid := func(t *testing.T, clk *clocktesting.FakeClock, top *Authority, zone string, serving ...string) *Authority {
		cfg := testConfig(t, clk)
		cfg.Upstream = authorityUpstream{top}
		cfg.Registerer = prometheus.NewRegistry()
		cfg.WorkloadDNSZone = zone
		cfg.ServingDNSNames = serving
		mid, err := New(cfg)
		require.NoError(t, err)
		return mid
	}

	t.Run("same zone", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(t0)
		top := newTop(t, clk, "svc.cluster.local")
		mid := newMid(t, clk, top, "svc.cluster.local", "trustbridge.region.svc.cluster.local")
		require.NoError(t, mid.Ready())
		leafVerifies(t, mid)

		id := spiffeid.RequireFromPath(tdExample, "/ns/prod/sa/web")
		issued, err := mid.SignWithDNSNames(workloadCSR(t, id), id, 0, []string{"web.prod.svc.cluster.local"})
		require.NoError(t, err)
		verifyDNS(t, top, issued, "web.prod.svc.cluster.local")

		sc, err := mid.ServingCert(spiffeid.RequireFromPath(tdExample, "/trustbridge/ca"), time.Hour, WithDNSNames("trustbridge.region.svc.cluster.local"))
		require.NoError(t, err)
		tc, err := sc.GetCertificate(nil)
		require.NoError(t, err)
		served := &Issued{Leaf: sc.Leaf()}
		for _, der := range tc.Certificate {
			c, err := x509.ParseCertificate(der)
			require.NoError(t, err)
			served.Chain = append(served.Chain, c)
		}
		verifyDNS(t, top, served, "trustbridge.region.svc.cluster.local")
	})
	t.Run("a zone below the upstream's", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(t0)
		mid := newMid(t, clk, newTop(t, clk, "example.org"), "region.example.org")
		require.NoError(t, mid.Ready())
	})
	t.Run("no DNS names either side", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(t0)
		mid := newMid(t, clk, newTop(t, clk, ""), "")
		require.NoError(t, mid.Ready())
		leafVerifies(t, mid)
	})
	for _, tc := range []struct {
		name, topZone, midZone string
		serving                []string
		want                   []string
	}{
		{"another zone", "svc.cluster.local", "example.org", nil,
			[]string{`permits DNS names only under ["svc.cluster.local"]`, `names under "example.org" (--workload-dns-name-template)`}},
		{"a zone above the upstream's", "svc.cluster.local", "cluster.local", nil, []string{`"cluster.local" (--workload-dns-name-template)`}},
		{"upstream without a template", "", "svc.cluster.local", nil, []string{"excludes every DNS name", "--workload-dns-name-template"}},
		{"serving name outside", "svc.cluster.local", "svc.cluster.local", []string{"trustbridge.trustbridge.svc"},
			[]string{`DNS name "trustbridge.trustbridge.svc" (--grpc-dns-names)`}},
		{"serving name, no template upstream", "", "", []string{"trustbridge.region.internal"}, []string{"excludes every DNS name", "--grpc-dns-names"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			mid := newMid(t, clk, newTop(t, clk, tc.topZone), tc.midZone, tc.serving...)
			err := mid.Ready()
			require.Error(t, err, "no intermediate: the CA does not sign what would not verify")
			for _, w := range tc.want {
				assert.ErrorContains(t, err, w)
			}
			_, err = mid.Sign(workloadCSR(t, spiffeid.RequireFromPath(tdExample, "/w")), spiffeid.RequireFromPath(tdExample, "/w"), 0)
			assert.Error(t, err)
		})
	}
}

// verifyDNS checks issued's leaf for host name name against top's
// roots, and as an X509-SVID.
func verifyDNS(t *testing.T, top *Authority, issued *Issued, name string) {
	t.Helper()
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range top.Bundle().X509Authorities() {
		roots.AddCert(r)
	}
	for _, c := range issued.Chain[1:] {
		inter.AddCert(c)
	}
	_, err := issued.Leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, Intermediates: inter, CurrentTime: t0})
	require.NoError(t, err)
	var raw [][]byte
	for _, c := range issued.Chain {
		if !isRoot(c, top.Bundle().X509Authorities()) {
			raw = append(raw, c.Raw)
		}
	}
	_, _, err = x509svid.ParseAndVerify(raw, x509bundle.FromX509Authorities(tdExample, top.Bundle().X509Authorities()), x509svid.WithTime(t0))
	require.NoError(t, err)
}

func TestDNSMatches(t *testing.T) {
	for _, tc := range []struct {
		name, constraint string
		want             bool
	}{
		{"a.example.org", "example.org", true},
		{"example.org", "example.org", true},
		{"A.Example.ORG", "example.org", true},
		{"aexample.org", "example.org", false},
		{"example.org.evil", "example.org", false},
		{"a.example.org", ".example.org", true},
		{"example.org", ".example.org", false},
		{"anything", "", true},
	} {
		assert.Equal(t, tc.want, dnsMatches(tc.name, tc.constraint), "%q under %q", tc.name, tc.constraint)
	}
}

// zoneAdmitted and nameAdmitted agree with crypto/x509 on certificates
// carrying the constraints, the leading-dot and excluded forms included.
func TestZoneAdmittedAgreesWithVerify(t *testing.T) {
	for _, tc := range []struct {
		name                string
		permitted, excluded []string
		zone                string
		want                bool
		probe               string // a workload name in zone that verification must treat as want says
	}{
		{"permitted equal", []string{"svc.cluster.local"}, nil, "svc.cluster.local", true, "web.prod.svc.cluster.local"},
		{"permitted above", []string{"cluster.local"}, nil, "svc.cluster.local", true, "web.prod.svc.cluster.local"},
		{"permitted below", []string{"svc.cluster.local"}, nil, "cluster.local", false, "web.prod.cluster.local"},
		{"permitted leading dot", []string{".svc.cluster.local"}, nil, "svc.cluster.local", true, "web.prod.svc.cluster.local"},
		{"excluded all", nil, []string{""}, "svc.cluster.local", false, "web.prod.svc.cluster.local"},
		{"excluded above", nil, []string{"cluster.local"}, "svc.cluster.local", false, "web.prod.svc.cluster.local"},
		{"excluded inside", nil, []string{"prod.svc.cluster.local"}, "svc.cluster.local", false, "web.prod.svc.cluster.local"},
		{"excluded elsewhere", nil, []string{"corp.internal"}, "svc.cluster.local", true, "web.prod.svc.cluster.local"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := testca.New(t, "example.org", testca.Options{NotBefore: t0.Add(-time.Hour), Mutate: func(c *x509.Certificate) {
				c.PermittedDNSDomains, c.ExcludedDNSDomains = tc.permitted, tc.excluded
			}})
			assert.Equal(t, tc.want, zoneAdmitted(root.Cert, tc.zone))
			assert.Equal(t, tc.want, nameAdmitted(root.Cert, tc.probe))
			leaf := mintUnder(t, root.Cert, root.Key, t0, &x509.Certificate{DNSNames: []string{tc.probe}})
			err := verifyUnder(leaf, &UpstreamChain{Roots: []*x509.Certificate{root.Cert}}, t0)
			assert.Equal(t, tc.want, err == nil, "crypto/x509 on %s: %v", tc.probe, err)
		})
	}
}

func TestConfigChecksDNSNames(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	for _, tc := range []struct {
		zone    string
		serving []string
		want    string
	}{
		{zone: "*.svc", want: "(--workload-dns-name-template): wildcards"},
		{zone: "10.0.0.1", want: "(--workload-dns-name-template): an IP address"},
		{serving: []string{"a.example", "A.example"}, want: "(--grpc-dns-names): DNS name 1"},
	} {
		cfg := testConfig(t, clk)
		cfg.WorkloadDNSZone, cfg.ServingDNSNames = tc.zone, tc.serving
		_, err := New(cfg)
		assert.ErrorContains(t, err, tc.want)
	}
	cfg := testConfig(t, clk)
	cfg.WorkloadDNSZone = "SVC.Cluster.Local"
	a, err := New(cfg)
	require.NoError(t, err)
	assert.Equal(t, "svc.cluster.local", a.cfg.WorkloadDNSZone, "matched without regard to case, kept lowercase")
}
