package oidc

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// The SPIFFE ID template language: literal text plus {{.TrustDomain}} and
// {{.Claims.<dotted path>}} (spaces inside the braces allowed), nothing
// else. It is deliberately not text/template: no functions, pipelines or
// conditionals, so a reviewer sees every ID a template can make, and a
// claim value can only ever fill the place its placeholder holds.
const (
	tdPlaceholder     = ".TrustDomain"
	claimsPlaceholder = ".Claims."
	spiffePrefix      = "spiffe://"
	// maxTemplateLen and maxIDLen follow the SPIFFE ID spec's 2048-byte
	// URI bound; maxSegmentLen is a claim value's share of it.
	maxTemplateLen = 2048
	maxIDLen       = 2048
	maxSegmentLen  = 255
)

// tmplPart is a literal, the trust domain, or a claim.
type tmplPart struct {
	lit   string
	td    bool
	claim string // dotted path; "" for the other kinds
	col   int    // 1-based byte column of a placeholder's {{, for errors
}

// template is a parsed SPIFFE ID template.
type template struct {
	parts []tmplPart
	// literalTD is the trust domain the template names literally, "" when
	// it uses {{.TrustDomain}}; New requires it to be the server's.
	literalTD string
	// segments is the number of path segments of every ID it makes.
	segments int
}

// parseTemplate parses and checks s: it must start with
// "spiffe://{{.TrustDomain}}/" or "spiffe://<trust domain>/", and its
// path, with each claim taken as a valid segment, must be a valid
// non-root SPIFFE ID path. Errors name the 1-based byte column.
func parseTemplate(s string) (*template, error) {
	if len(s) > maxTemplateLen {
		return nil, fmt.Errorf("template is %d bytes, more than %d", len(s), maxTemplateLen)
	}
	parts, err := lexTemplate(s)
	if err != nil {
		return nil, err
	}
	t := &template{parts: parts}
	if err := t.checkShape(s); err != nil {
		return nil, err
	}
	return t, nil
}

// lexTemplate splits s into literal text and placeholders.
func lexTemplate(s string) ([]tmplPart, error) {
	var parts []tmplPart
	for i := 0; i < len(s); {
		open := strings.Index(s[i:], "{{")
		if open < 0 {
			open = len(s) - i
		}
		if lit := s[i : i+open]; lit != "" {
			if j := strings.IndexAny(lit, "{}"); j >= 0 {
				return nil, fmt.Errorf("column %d: stray %q outside a {{...}} placeholder", i+j+1, lit[j])
			}
			parts = append(parts, tmplPart{lit: lit})
		}
		i += open
		if i >= len(s) {
			break
		}
		end := strings.Index(s[i+2:], "}}")
		if end < 0 {
			return nil, fmt.Errorf("column %d: {{ is not closed by }}", i+1)
		}
		p, err := placeholder(s[i+2:i+2+end], i+1)
		if err != nil {
			return nil, err
		}
		p.col = i + 1
		parts = append(parts, p)
		i += 2 + end + 2
	}
	return parts, nil
}

// placeholder reads what is between {{ and }}, found at column col.
func placeholder(inner string, col int) (tmplPart, error) {
	expr := strings.Trim(inner, " ")
	switch {
	case expr == tdPlaceholder:
		return tmplPart{td: true}, nil
	case strings.HasPrefix(expr, claimsPlaceholder):
		path := expr[len(claimsPlaceholder):]
		if err := checkClaimPath(path); err != nil {
			return tmplPart{}, fmt.Errorf("column %d: {{%s}}: %w (functions and pipelines are not supported)", col, truncate(inner, 64), err)
		}
		return tmplPart{claim: path}, nil
	}
	return tmplPart{}, fmt.Errorf("column %d: {{%s}} is not {{%s}} or {{%s<claim>}} (nothing else is supported)", col, truncate(inner, 64), tdPlaceholder, claimsPlaceholder)
}

// checkShape checks the scheme, trust domain and path of the template,
// with each claim standing for a one-byte segment part, and counts its
// segments.
func (t *template) checkShape(src string) error {
	if len(t.parts) == 0 || t.parts[0].td || t.parts[0].claim != "" || !strings.HasPrefix(t.parts[0].lit, spiffePrefix) {
		return fmt.Errorf("template %q must start with %s{{%s}}/ or %s<trust domain>/", truncate(src, 64), spiffePrefix, tdPlaceholder, spiffePrefix)
	}
	rest := t.parts[1:]
	afterScheme := strings.TrimPrefix(t.parts[0].lit, spiffePrefix)
	var path strings.Builder
	if afterScheme == "" {
		if len(rest) == 0 || !rest[0].td {
			return fmt.Errorf("template %q must start with %s{{%s}}/ or %s<trust domain>/", truncate(src, 64), spiffePrefix, tdPlaceholder, spiffePrefix)
		}
		rest = rest[1:]
	} else {
		td, p, ok := strings.Cut(afterScheme, "/")
		if _, err := spiffeid.TrustDomainFromString(td); err != nil || !ok {
			return fmt.Errorf("template %q: %q is not a trust domain followed by /", truncate(src, 64), truncate(td, 64))
		}
		t.literalTD = td
		path.WriteString("/" + p)
	}
	if err := writeSkeleton(&path, rest, src); err != nil {
		return err
	}
	skeleton := path.String()
	if err := spiffeid.ValidatePath(skeleton); err != nil || skeleton == "" {
		return fmt.Errorf("template %q: the path (claims standing for one valid segment each) must be a non-root SPIFFE ID path of / separated segments of A-Z a-z 0-9 . - _ (no . or .. segments)", truncate(src, 64))
	}
	t.segments = strings.Count(skeleton, "/")
	return nil
}

// writeSkeleton writes the path parts after the trust domain to path,
// each claim standing for the one-byte segment part "x", refusing
// {{.TrustDomain}} in the path and two claims in one segment.
func writeSkeleton(path *strings.Builder, rest []tmplPart, src string) error {
	claimsInSegment := 0
	for _, p := range rest {
		switch {
		case p.td:
			return fmt.Errorf("template %q: {{%s}} is only allowed as the trust domain", truncate(src, 64), tdPlaceholder)
		case p.claim != "":
			if claimsInSegment++; claimsInSegment > 1 {
				return errTwoClaims(p)
			}
			path.WriteString("x")
		default:
			if strings.Contains(p.lit, "/") {
				claimsInSegment = 0
			}
			path.WriteString(p.lit)
		}
	}
	return nil
}

// errTwoClaims refuses a second claim placeholder in one path segment:
// values side by side cannot be told apart once joined, whatever literal
// text stands between them, since a value may contain that text too.
func errTwoClaims(p tmplPart) error {
	return fmt.Errorf("column %d: {{%s%s}} is a second claim placeholder in one path segment, which is ambiguous "+
		"({{.Claims.org}}-{{.Claims.repo}} is the same for acme/payments-api and acme-payments/api); "+
		"give each claim a segment of its own (literal text beside one claim is fine)", p.col, claimsPlaceholder, truncate(p.claim, 64))
}

// checkTrustDomain refuses a template that names a trust domain other
// than td.
func (t *template) checkTrustDomain(td spiffeid.TrustDomain) error {
	if t.literalTD != "" && t.literalTD != td.Name() {
		return fmt.Errorf("template names trust domain %q, not this server's %q; use {{%s}}", t.literalTD, td.Name(), tdPlaceholder)
	}
	return nil
}

// execute builds the SPIFFE ID for claims. Every claim value must be a
// valid path segment on its own (checkSegment), so no value can add a
// segment, climb out of its place or change the trust domain; the result
// is checked again all the same.
func (t *template) execute(td spiffeid.TrustDomain, claims map[string]any) (spiffeid.ID, error) {
	var b strings.Builder
	for _, p := range t.parts {
		switch {
		case p.td:
			b.WriteString(td.Name())
		case p.claim != "":
			v, err := claimSegment(claims, p.claim)
			if err != nil {
				return spiffeid.ID{}, err
			}
			b.WriteString(v)
		default:
			b.WriteString(p.lit)
		}
	}
	if b.Len() > maxIDLen {
		return spiffeid.ID{}, fmt.Errorf("the SPIFFE ID would be %d bytes, more than %d", b.Len(), maxIDLen)
	}
	id, err := spiffeid.FromString(b.String())
	switch {
	case err != nil:
		return spiffeid.ID{}, fmt.Errorf("the claims do not form a SPIFFE ID: %w", err)
	case id.TrustDomain() != td:
		return spiffeid.ID{}, fmt.Errorf("the SPIFFE ID is not in trust domain %q", td.Name())
	case strings.Count(id.Path(), "/") != t.segments:
		return spiffeid.ID{}, fmt.Errorf("the SPIFFE ID has %d path segments, not the template's %d", strings.Count(id.Path(), "/"), t.segments)
	}
	return id, nil
}

// claimSegment is the value of the claim at path as a path segment: a
// string, or a number by its JSON text (e.g. GitHub's repository_id).
func claimSegment(claims map[string]any, path string) (string, error) {
	v, err := lookup(claims, path)
	if err != nil {
		return "", fmt.Errorf("claim %q %w", path, err)
	}
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case json.Number:
		s = v.String()
	default:
		return "", fmt.Errorf("claim %q is %s, not a string or number", path, jsonKind(v))
	}
	if err := checkSegment(s); err != nil {
		return "", fmt.Errorf("claim %q: %w", path, err)
	}
	return s, nil
}

// checkSegment accepts exactly one SPIFFE ID path segment (SPIFFE ID
// §2.2): 1 to maxSegmentLen of A-Z a-z 0-9 . - _, not "." or "..". So no
// "/", no percent-encoding, no whitespace, no look-alike unicode.
func checkSegment(s string) error {
	switch {
	case s == "":
		return errors.New("value is empty")
	case len(s) > maxSegmentLen:
		return fmt.Errorf("value is %d bytes, more than %d", len(s), maxSegmentLen)
	case s == "." || s == "..":
		return fmt.Errorf("value %q is a relative path segment", s)
	}
	for i := 0; i < len(s); i++ {
		if !segmentByte(s[i]) {
			return fmt.Errorf("value %q: byte %d is not one of A-Z a-z 0-9 . - _", truncate(s, 64), i+1)
		}
	}
	return nil
}

func segmentByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_'
}

// jsonKind names a decoded JSON value's type for an error message.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	}
	return fmt.Sprintf("a %T", v)
}
