package agent

import (
	"crypto/x509"
	"path/filepath"
	"slices"
	"testing"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/pemfile"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
	"github.com/trustbridge/trustbridge/sds"
)

func uriMatcher(v string, prefix bool) *tlsv3.SubjectAltNameMatcher {
	m := &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: v}}
	if prefix {
		m = &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: v}}
	}
	return &tlsv3.SubjectAltNameMatcher{SanType: tlsv3.SubjectAltNameMatcher_URI, Matcher: m}
}

func TestParseSANMatchers(t *testing.T) {
	byTD := map[spiffeid.TrustDomain][]*x509.Certificate{tdA: nil, tdB: nil}
	peer := "spiffe://b.test/ns/billing/sa/api"
	dns := uriMatcher("spiffe://b.test/", true)
	dns.SanType = tlsv3.SubjectAltNameMatcher_DNS
	regex := &tlsv3.SubjectAltNameMatcher{SanType: tlsv3.SubjectAltNameMatcher_URI,
		Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: ".*"}}}}
	ignoreCase := uriMatcher(peer, false)
	ignoreCase.Matcher.IgnoreCase = true
	tests := []struct {
		name string
		in   []*tlsv3.SubjectAltNameMatcher
		want peerLimits
		err  string
	}{
		{name: "none: every member", want: peerLimits{tdA: nil, tdB: nil}},
		{name: "whole trust domains", in: []*tlsv3.SubjectAltNameMatcher{uriMatcher("spiffe://a.test/", true), uriMatcher("spiffe://b.test/", true)},
			want: peerLimits{tdA: nil, tdB: nil}},
		{name: "peers", in: []*tlsv3.SubjectAltNameMatcher{uriMatcher("spiffe://a.test/", true), uriMatcher(peer, false), uriMatcher("spiffe://b.test/ns/ops/", true)},
			want: peerLimits{tdA: nil, tdB: {peer, "spiffe://b.test/ns/ops/*"}}},
		{name: "whole wins over peers", in: []*tlsv3.SubjectAltNameMatcher{uriMatcher("spiffe://a.test/", true), uriMatcher(peer, false), uriMatcher("spiffe://b.test/", true)},
			want: peerLimits{tdA: nil, tdB: nil}},
		{name: "trust domain without matcher", in: []*tlsv3.SubjectAltNameMatcher{uriMatcher("spiffe://a.test/", true)}, err: `"b.test" has no SAN matcher`},
		{name: "local limited", in: []*tlsv3.SubjectAltNameMatcher{uriMatcher("spiffe://a.test/x", false), uriMatcher(peer, false)}, err: "local trust domain"},
		{name: "trust domain not in ALL", in: []*tlsv3.SubjectAltNameMatcher{uriMatcher("spiffe://a.test/", true), uriMatcher(peer, false), uriMatcher("spiffe://c.test/", true)}, err: "not in ALL"},
		{name: "prefix without slash", in: []*tlsv3.SubjectAltNameMatcher{uriMatcher("spiffe://a.test/", true), uriMatcher("spiffe://b.test/ns/pay", true)}, err: "ending in '/'"},
		{name: "prefix of a trust domain name", in: []*tlsv3.SubjectAltNameMatcher{uriMatcher("spiffe://a.test/", true), uriMatcher("spiffe://b.te", true)}, err: "ending in '/'"},
		{name: "non-canonical exact", in: []*tlsv3.SubjectAltNameMatcher{uriMatcher("spiffe://a.test/", true), uriMatcher("spiffe://B.test/x", false)}, err: "not a canonical"},
		{name: "denial SAN", in: []*tlsv3.SubjectAltNameMatcher{uriMatcher("spiffe://a.test/", true), uriMatcher(sds.DeniedSAN, false)}, err: "not a canonical"},
		{name: "DNS", in: []*tlsv3.SubjectAltNameMatcher{uriMatcher("spiffe://a.test/", true), dns}, err: "want URI"},
		{name: "regex", in: []*tlsv3.SubjectAltNameMatcher{uriMatcher("spiffe://a.test/", true), regex}, err: "want an exact"},
		{name: "ignore case", in: []*tlsv3.SubjectAltNameMatcher{uriMatcher("spiffe://a.test/", true), ignoreCase}, err: "ignore_case"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseSANMatchers(tt.in, byTD, tdA)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			_, err = relayedPolicy(tdA, workload, "test", got)
			assert.NoError(t, err)
		})
	}
}

// sanStrings renders a validation context's matchers as "exact:"/"prefix:".
func sanStrings(vc *tlsv3.CertificateValidationContext) []string {
	var out []string
	for _, m := range vc.GetMatchTypedSubjectAltNames() {
		if v := m.GetMatcher().GetExact(); v != "" {
			out = append(out, "exact:"+v)
		} else {
			out = append(out, "prefix:"+m.GetMatcher().GetPrefix())
		}
	}
	return out
}

func isDenial(s *tlsv3.Secret) bool {
	if s == nil {
		return false
	}
	roots, err := pemfile.ParseCertificates(s.GetValidationContext().GetTrustedCa().GetInlineBytes())
	return err == nil && len(roots) == 1 && roots[0].Subject.CommonName == sds.DeniedSubjectPrefix+"c.test denied" &&
		slices.Equal(sanStrings(s.GetValidationContext()), []string{"exact:" + sds.DeniedSAN})
}

// The agent relays what the server decided for its workload and never
// widens it: the server's peer limits reach the local ALL and
// spiffe://<td>, and a trust domain the server stops sending is denied
// locally, not left to Envoy's last copy.
func TestRelayPolicy(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "socket")
	caA, caB, caC := testca.New(t, tdA.Name()), testca.New(t, tdB.Name()), testca.New(t, tdC.Name())
	trust := sds.NewTrustCell()
	require.NoError(t, trust.Set([]*x509bundle.Bundle{bundleOf(caA), bundleOf(caB), bundleOf(caC)}))
	peer := "spiffe://b.test/ns/billing/sa/api"
	compile := func(rules ...trustpolicy.Rule) *trustpolicy.Policy {
		p, err := trustpolicy.Compile(tdA, trustpolicy.DefaultAllow, rules)
		require.NoError(t, err)
		return p
	}
	rule := func(name, sel string, grants ...trustpolicy.TrustDomainGrant) trustpolicy.Rule {
		return trustpolicy.Rule{Name: name, Origin: "test", Workloads: []trustpolicy.Selector{{SPIFFEID: sel}}, TrustDomains: grants}
	}
	cell := trustpolicy.NewCell(compile(rule("web", workload.String(),
		trustpolicy.TrustDomainGrant{TrustDomain: "b.test", Peers: []string{peer}},
		trustpolicy.TrustDomainGrant{TrustDomain: "c.test"})))
	up := newUpstreamWith(t, caA, trust, "", trustpolicy.NewAccess(cell, nil))
	a := caAgent(t, sock, newFakeRotator(t, caA, workload), up.addr, prometheus.NewRegistry())
	_, done := runAgent(t, a)
	waitSocket(t, sock, done)

	names := []string{sds.AllName, "spiffe://b.test", "spiffe://c.test"}
	s := mustStream(t, sock, names...)
	got := collect(t, s, func(m map[string]*tlsv3.Secret) bool {
		return hasAll(names...)(m) && slices.Equal(trustDomainsOf(t, m[sds.AllName]), []string{"a.test", "b.test", "c.test"})
	}, names...)
	assert.Equal(t, []string{"prefix:spiffe://a.test/", "exact:" + peer, "prefix:spiffe://c.test/"}, sanStrings(got[sds.AllName].GetValidationContext()))
	assert.Equal(t, []string{"exact:" + peer}, sanStrings(got["spiffe://b.test"].GetValidationContext()))
	assert.Empty(t, sanStrings(got["spiffe://c.test"].GetValidationContext()))

	// The server's policy takes c.test away from the workload.
	cell.Set(compile(
		rule("web", workload.String(), trustpolicy.TrustDomainGrant{TrustDomain: "b.test", Peers: []string{peer}}),
		rule("other", "spiffe://a.test/ns/other/*", trustpolicy.TrustDomainGrant{TrustDomain: "c.test"})))
	got = collect(t, s, func(m map[string]*tlsv3.Secret) bool {
		return slices.Equal(trustDomainsOf(t, m[sds.AllName]), []string{"a.test", "b.test"}) && isDenial(m["spiffe://c.test"])
	}, names...)
	assert.Equal(t, []string{"prefix:spiffe://a.test/", "exact:" + peer}, sanStrings(got[sds.AllName].GetValidationContext()))
	all, err := parseSPIFFEValidator(got[sds.AllName].GetValidationContext())
	require.NoError(t, err)
	assert.NotContains(t, all, tdC)
}
