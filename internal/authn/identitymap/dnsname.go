package identitymap

import (
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/util/validation"
)

// maxDNSTemplateLen bounds a DNS name template: a name is at most 253
// bytes, and placeholders are shorter than most values.
const maxDNSTemplateLen = 512

// parseDNSTemplate parses and checks a DNS name template: literal text of
// a-z 0-9 . - only (no wildcards, no upper case) and placeholders, at most
// one fact in a label, {{.TrustDomain}} standing for its labels; with each
// fact taken as "x" and the trust domain as "x", the name must be a valid
// RFC 1123 host name.
func parseDNSTemplate(s string) (*template, error) {
	if len(s) > maxDNSTemplateLen {
		return nil, fmt.Errorf("template is %d bytes, more than %d", len(s), maxDNSTemplateLen)
	}
	parts, err := lex(s)
	if err != nil {
		return nil, err
	}
	t := &template{src: s, parts: parts}
	var b strings.Builder
	for _, p := range parts {
		if i := strings.IndexFunc(p.lit, func(r rune) bool { return !dnsRune(r) && r != '.' }); i >= 0 {
			return nil, fmt.Errorf("template %q: %q is not allowed in a DNS name (a-z 0-9 . - only: no wildcards, no upper case)", truncate(s, 64), p.lit[i:i+1])
		}
	}
	var withoutTD []part
	for _, p := range parts {
		if p.td {
			p = part{lit: "x"} // the trust domain is the operator's, a valid name
		}
		withoutTD = append(withoutTD, p)
	}
	if err := t.writeSkeleton(&b, withoutTD, ".", "DNS label"); err != nil {
		return nil, err
	}
	if err := checkDNSName(b.String()); err != nil {
		return nil, fmt.Errorf("template %q (facts standing for one valid label part each): %w", truncate(s, 64), err)
	}
	return t, nil
}

// dnsName builds the DNS name for w. Every fact must be a part of one DNS
// label (a-z 0-9 -, at most 63 bytes): a value can never add a label, and
// values with upper case are refused rather than folded, which could make
// two workloads share a name.
func (t *template) dnsName(td spiffeid.TrustDomain, w *Workload) (string, error) {
	s, err := t.render(td, w, checkLabelPart)
	if err != nil {
		return "", err
	}
	if err := checkDNSName(s); err != nil {
		return "", fmt.Errorf("the facts do not form a DNS name: %w", err)
	}
	return s, nil
}

func checkLabelPart(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("value is empty")
	case len(s) > validation.DNS1123LabelMaxLength:
		return fmt.Errorf("value is %d bytes, more than a DNS label's %d", len(s), validation.DNS1123LabelMaxLength)
	}
	if i := strings.IndexFunc(s, func(r rune) bool { return !dnsRune(r) }); i >= 0 {
		return fmt.Errorf("value %q: byte %d is not one of a-z 0-9 - (one DNS label, lower case)", truncate(s, 64), i+1)
	}
	return nil
}

// checkDNSName accepts an RFC 1123 host name of lower case labels, each
// at most 63 bytes, at most 253 in all.
func checkDNSName(s string) error {
	if errs := validation.IsDNS1123Subdomain(s); len(errs) > 0 {
		return fmt.Errorf("%q is not a DNS name: %s", truncate(s, 64), strings.Join(errs, "; "))
	}
	for _, l := range strings.Split(s, ".") {
		if errs := validation.IsDNS1123Label(l); len(errs) > 0 {
			return fmt.Errorf("%q: label %q: %s", truncate(s, 64), truncate(l, 64), strings.Join(errs, "; "))
		}
	}
	return nil
}

func dnsRune(c rune) bool {
	return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-'
}
