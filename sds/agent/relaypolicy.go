package agent

import (
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// maxSANMatchers bounds the SAN matchers of the server's ALL.
const maxSANMatchers = 4096

// peerLimits is what the server's ALL lets the workload accept of each
// trust domain it carries: nil for every member, else the peer patterns
// (trustpolicy.Pattern syntax). A trust domain absent from ALL is denied.
type peerLimits map[spiffeid.TrustDomain][]string

// parseSANMatchers maps ALL's match_typed_subject_alt_names back to the
// trust domains of byTD (untrusted input). Each matcher is a URI SAN
// matcher, exact (one SPIFFE ID) or prefix (a path ending "/", or
// "spiffe://<td>/" for every member), of a trust domain ALL carries;
// every trust domain of ALL must have one, and the local one must be
// whole: a server that sent anything else does not speak this relay's
// language, and guessing could widen what it decided. No matchers means
// every member of every trust domain of ALL.
func parseSANMatchers(ms []*tlsv3.SubjectAltNameMatcher, byTD map[spiffeid.TrustDomain][]*x509.Certificate, local spiffeid.TrustDomain) (peerLimits, error) {
	out := make(peerLimits, len(byTD))
	for td := range byTD {
		out[td] = nil
	}
	if len(ms) == 0 {
		return out, nil
	}
	if len(ms) > maxSANMatchers {
		return nil, fmt.Errorf("%d SAN matchers; at most %d are accepted", len(ms), maxSANMatchers)
	}
	whole := make(map[spiffeid.TrustDomain]bool)
	peers := make(map[spiffeid.TrustDomain][]string)
	for i, m := range ms {
		td, pattern, err := parseSANMatcher(m)
		if err != nil {
			return nil, fmt.Errorf("SAN matcher %d: %w", i, err)
		}
		if _, ok := byTD[td]; !ok {
			return nil, fmt.Errorf("SAN matcher %d: trust domain %q is not in %s", i, td.Name(), "ALL")
		}
		if pattern == "" {
			whole[td] = true
		} else {
			peers[td] = append(peers[td], pattern)
		}
	}
	for td := range byTD {
		switch {
		case whole[td]:
		case td == local:
			return nil, fmt.Errorf("the local trust domain %q is limited to some peers; the agent relays only limits on federated trust domains", td.Name())
		case len(peers[td]) == 0:
			return nil, fmt.Errorf("trust domain %q has no SAN matcher", td.Name())
		default:
			out[td] = peers[td]
		}
	}
	return out, nil
}

// parseSANMatcher returns the trust domain of one matcher and its peer
// pattern, "" for every member.
func parseSANMatcher(m *tlsv3.SubjectAltNameMatcher) (spiffeid.TrustDomain, string, error) {
	if m.GetSanType() != tlsv3.SubjectAltNameMatcher_URI {
		return spiffeid.TrustDomain{}, "", fmt.Errorf("SAN type %s, want URI", m.GetSanType())
	}
	if m.GetOid() != "" || m.GetMatcher().GetIgnoreCase() {
		return spiffeid.TrustDomain{}, "", errors.New("oid or ignore_case set")
	}
	if v := m.GetMatcher().GetExact(); v != "" {
		p, err := trustpolicy.ParsePattern(v)
		if err != nil || p.IsPrefix() {
			return spiffeid.TrustDomain{}, "", fmt.Errorf("exact %q is not a canonical SPIFFE ID", v)
		}
		return p.TrustDomain(), v, nil
	}
	v := m.GetMatcher().GetPrefix()
	base, ok := strings.CutSuffix(v, "/")
	if !ok || !strings.HasPrefix(v, "spiffe://") {
		return spiffeid.TrustDomain{}, "", fmt.Errorf("want an exact SPIFFE ID or a prefix spiffe://<td>/... ending in '/', got %v", m.GetMatcher())
	}
	if td, err := spiffeid.TrustDomainFromString(base); err == nil && td.IDString() == base {
		return td, "", nil
	}
	p, err := trustpolicy.ParsePattern(base + "/*")
	if err != nil {
		return spiffeid.TrustDomain{}, "", fmt.Errorf("prefix %q: %w", v, err)
	}
	return p.TrustDomain(), p.String(), nil
}

// relayedPolicy is the server's decision for id as a policy of the local
// SDS server: one rule granting id exactly the federated trust domains of
// ALL with their peer limits, every other trust domain denied.
func relayedPolicy(local spiffeid.TrustDomain, id spiffeid.ID, origin string, limits peerLimits) (*trustpolicy.Policy, error) {
	var rules []trustpolicy.Rule
	tds := slices.SortedFunc(maps.Keys(limits), func(a, b spiffeid.TrustDomain) int { return strings.Compare(a.Name(), b.Name()) })
	var grants []trustpolicy.TrustDomainGrant
	for _, td := range tds {
		if td != local {
			grants = append(grants, trustpolicy.TrustDomainGrant{TrustDomain: td.Name(), Peers: limits[td]})
		}
	}
	if len(grants) > 0 {
		rules = append(rules, trustpolicy.Rule{
			Name:         "relayed-from-server",
			Origin:       origin,
			Workloads:    []trustpolicy.Selector{{SPIFFEID: id.String()}},
			TrustDomains: grants,
		})
	}
	return trustpolicy.Compile(local, trustpolicy.DefaultDeny, rules)
}
