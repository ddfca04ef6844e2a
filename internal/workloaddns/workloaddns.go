package workloaddns

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/authn"
)

// Limits of DNS names (RFC 1035 §2.3.4: 255 octets on the wire, 253
// characters in text without the trailing dot; labels of 63).
const (
	MaxNameLen  = 253
	MaxLabelLen = 63
	// MaxTemplateLen bounds a template before parsing; a valid one is far
	// shorter, since its result must fit MaxNameLen.
	MaxTemplateLen = 512
)

// Placeholders of the template language.
const (
	PlaceholderServiceAccount = "{sa}"
	PlaceholderNamespace      = "{ns}"
	PlaceholderTrustDomain    = "{td}"
)

// ErrSkipped is wrapped by Names when the identity is a Kubernetes one but
// cannot have a DNS name (its service account name is not one DNS label,
// its ID is not a service account's, its grant names another account).
// The certificate is still issued, with its SPIFFE ID only.
var ErrSkipped = errors.New("no DNS name for this identity")

// Template is a parsed workload DNS name template. It is immutable and
// safe for concurrent use.
type Template struct {
	raw string
	td  spiffeid.TrustDomain
	// parts are literal text (the trust domain already substituted) and
	// the placeholders {sa} and {ns}, in order.
	parts []string
	// reserved are names no workload gets, lowercased.
	reserved map[string]bool
}

// String is the template as written.
func (t *Template) String() string { return t.raw }

// Parse checks a template against the trust domain whose identities it
// names; see the package documentation for the language. The checks that
// do not depend on a workload are made here, at startup: characters,
// placeholders, and that the result for one-letter names is a valid DNS
// name.
//
// reserved are names no workload may have: those of the server's own
// serving certificates. Clients that reach the server by host name and
// check it against the CA's roots (Istio agents dialing
// istiod.istio-system.svc) must not accept a workload in its place, which
// {sa}.{ns}.svc would allow for a service account istiod in istio-system.
func Parse(template string, td spiffeid.TrustDomain, reserved ...string) (*Template, error) {
	if td.IsZero() {
		return nil, errors.New("workload DNS name template: no trust domain")
	}
	if len(template) > MaxTemplateLen {
		return nil, fmt.Errorf("workload DNS name template: %d bytes, at most %d", len(template), MaxTemplateLen)
	}
	parts, err := split(template)
	if err != nil {
		return nil, fmt.Errorf("workload DNS name template %q: %w", template, err)
	}
	if err := checkPlacement(parts); err != nil {
		return nil, fmt.Errorf("workload DNS name template %q: %w", template, err)
	}
	t := &Template{raw: template, td: td, reserved: make(map[string]bool, len(reserved))}
	for _, r := range reserved {
		t.reserved[strings.ToLower(r)] = true
	}
	for _, p := range parts {
		if p == PlaceholderTrustDomain {
			if err := checkTrustDomain(td); err != nil {
				return nil, fmt.Errorf("workload DNS name template %q: %w", template, err)
			}
			p = td.Name()
		}
		// Adjacent literals merge, so that expand has fewer pieces.
		if n := len(t.parts); n > 0 && !isPlaceholder(p) && !isPlaceholder(t.parts[n-1]) {
			t.parts[n-1] += p
			continue
		}
		t.parts = append(t.parts, p)
	}
	if err := CheckName(t.expand("a", "a")); err != nil {
		return nil, fmt.Errorf("workload DNS name template %q: for namespace \"a\" and service account \"a\" it gives an invalid DNS name: %w", template, err)
	}
	return t, nil
}

// split cuts a template into literal runs and placeholders, refusing
// characters no DNS name holds.
func split(template string) ([]string, error) {
	if template == "" {
		return nil, errors.New("empty")
	}
	var parts []string
	lit := 0 // start of the current literal run
	for i := 0; i < len(template); {
		c := template[i]
		switch {
		case c == '{':
			end := strings.IndexByte(template[i:], '}')
			if end < 0 {
				return nil, fmt.Errorf("column %d: '{' without '}'", i+1)
			}
			ph := template[i : i+end+1]
			if !isPlaceholder(ph) {
				return nil, fmt.Errorf("column %d: unknown placeholder %q; only {sa}, {ns} and {td}", i+1, truncate(ph, 32))
			}
			if lit < i {
				parts = append(parts, template[lit:i])
			}
			parts = append(parts, ph)
			i += end + 1
			lit = i
		case c == '*':
			return nil, fmt.Errorf("column %d: '*': wildcards are never issued", i+1)
		case 'A' <= c && c <= 'Z':
			return nil, fmt.Errorf("column %d: %q: write the template in lowercase", i+1, c)
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '.':
			i++
		default:
			r, _ := utf8.DecodeRuneInString(template[i:])
			return nil, fmt.Errorf("column %d: %+q: only a-z, 0-9, '-', '.' and the placeholders are allowed", i+1, r)
		}
	}
	if lit < len(template) {
		parts = append(parts, template[lit:])
	}
	return parts, nil
}

// checkPlacement makes each placeholder a whole label, {sa} and {ns}
// present exactly once, {td} at most once. Whole labels make the name
// decide the workload: "{sa}-{ns}" would give service account "a-b" in
// namespace "c" and "a" in "b-c" the same name.
func checkPlacement(parts []string) error {
	count := map[string]int{}
	for i, p := range parts {
		if !isPlaceholder(p) {
			continue
		}
		count[p]++
		if i > 0 && (isPlaceholder(parts[i-1]) || !strings.HasSuffix(parts[i-1], ".")) {
			return fmt.Errorf("%s must start the name or follow a '.': each placeholder is a whole DNS label", p)
		}
		if i+1 < len(parts) && (isPlaceholder(parts[i+1]) || !strings.HasPrefix(parts[i+1], ".")) {
			return fmt.Errorf("%s must end the name or be followed by a '.': each placeholder is a whole DNS label", p)
		}
	}
	for _, p := range []string{PlaceholderServiceAccount, PlaceholderNamespace} {
		if count[p] == 0 {
			return fmt.Errorf("%s is missing: without both {sa} and {ns}, two workloads would share a name", p)
		}
	}
	for p, n := range count {
		if n > 1 {
			return fmt.Errorf("%s appears %d times; at most once", p, n)
		}
	}
	return checkZone(parts)
}

// checkZone requires the name to end in a zone the operator fixed: a
// literal label or {td} after the last of {sa} and {ns}. Otherwise
// whoever names a namespace and a service account chooses any name the
// mesh's roots would vouch for: with "{sa}.{ns}", service account
// "google" in namespace "com" is google.com.
func checkZone(parts []string) error {
	last := -1
	for i, p := range parts {
		if p == PlaceholderServiceAccount || p == PlaceholderNamespace {
			last = i
		}
	}
	for _, p := range parts[last+1:] {
		if p == PlaceholderTrustDomain || strings.Trim(p, ".") != "" {
			return nil
		}
	}
	return errors.New("the name must end in a fixed zone, a literal label or {td} after {sa} and {ns} (e.g. {sa}.{ns}.svc.cluster.local or {sa}.{ns}.{td}): " +
		"otherwise whoever names a namespace and a service account chooses the whole name (namespace \"com\", service account \"google\": google.com)")
}

// checkTrustDomain refuses a trust domain name that is no DNS name: a
// SPIFFE trust domain may hold '_', a host name may not.
func checkTrustDomain(td spiffeid.TrustDomain) error {
	if err := CheckName(td.Name()); err != nil {
		return fmt.Errorf("{td}: trust domain %q is not a valid DNS name (%w); write the domain into the template instead of {td}", td.Name(), err)
	}
	return nil
}

func isPlaceholder(s string) bool {
	return s == PlaceholderServiceAccount || s == PlaceholderNamespace || s == PlaceholderTrustDomain
}

// Zone is the fixed part of every name the template gives: the literal
// text after the last of {sa} and {ns}, {td} substituted, without its
// leading '.' ("svc.cluster.local" for {sa}.{ns}.svc.cluster.local,
// "example.org" for {sa}.{ns}.{td}). Every name is below it by at least
// two labels, and Parse made sure it is not empty. A CA that lets another
// (a downstream intermediate) issue workload names permits this domain
// (RFC 5280 §4.2.1.10 dNSName: the zone and the names below it).
func (t *Template) Zone() string {
	last := t.parts[len(t.parts)-1]
	if isPlaceholder(last) {
		return "" // unreachable: checkZone refuses a template ending in one
	}
	return strings.TrimPrefix(last, ".")
}

// expand substitutes ns and sa.
func (t *Template) expand(ns, sa string) string {
	var b strings.Builder
	for _, p := range t.parts {
		switch p {
		case PlaceholderNamespace:
			b.WriteString(ns)
		case PlaceholderServiceAccount:
			b.WriteString(sa)
		default:
			b.WriteString(p)
		}
	}
	return b.String()
}

// Names returns the DNS names of the certificate for id, issued on grant
// g: nil and no error when g is not a Kubernetes grant (no name for other
// authenticators), one name when the template applies, or an error
// wrapping ErrSkipped that says why a Kubernetes identity gets none.
//
// For a kubernetes-jwt grant, whose Ref is "<namespace>/<name>" of the
// service account TokenReview confirmed, the ID must name that account. A
// kubernetes-issuer grant names its issuer; its ID was built from the
// token's verified kubernetes.io claims.
func (t *Template) Names(id spiffeid.ID, g authn.Grant) ([]string, error) {
	if !authn.IsKubernetesMethod(g.Method) {
		return nil, nil
	}
	if !id.MemberOf(t.td) {
		return nil, fmt.Errorf("%w: %s is not in trust domain %s", ErrSkipped, id, t.td.Name())
	}
	ns, sa, ok := authn.ServiceAccountOf(id)
	if !ok {
		return nil, fmt.Errorf("%w: %s is not of the form spiffe://%s/ns/<namespace>/sa/<name>", ErrSkipped, id, t.td.Name())
	}
	if g.Method == authn.MethodKubernetesJWT && g.Ref != ns+"/"+sa {
		return nil, fmt.Errorf("%w: the grant names service account %q, not the one of %s", ErrSkipped, g.Ref, id)
	}
	if err := CheckLabel(ns); err != nil {
		return nil, fmt.Errorf("%w: namespace %q: %w", ErrSkipped, truncate(ns, 64), err)
	}
	if err := CheckLabel(sa); err != nil {
		return nil, fmt.Errorf("%w: service account %q: %w", ErrSkipped, truncate(sa, 64), err)
	}
	name := t.expand(ns, sa)
	if err := CheckName(name); err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrSkipped, truncate(name, 64), err)
	}
	if t.reserved[name] {
		return nil, fmt.Errorf("%w: %q is a name of the server's own certificate, reserved", ErrSkipped, name)
	}
	return []string{name}, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
