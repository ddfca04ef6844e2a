package oidc

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/authn/idtemplate"
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
	if len(s) > idtemplate.MaxTemplateLen {
		return nil, fmt.Errorf("template is %d bytes, more than %d", len(s), idtemplate.MaxTemplateLen)
	}
	parts, err := idtemplate.Lex(s, func(lit string) tmplPart { return tmplPart{lit: lit} }, placeholder)
	if err != nil {
		return nil, err
	}
	t := &template{parts: parts}
	if err := t.checkShape(s); err != nil {
		return nil, err
	}
	return t, nil
}

// placeholder reads what is between {{ and }}, found at column col.
func placeholder(inner string, col int) (tmplPart, error) {
	expr := strings.Trim(inner, " ")
	switch {
	case expr == tdPlaceholder:
		return tmplPart{td: true, col: col}, nil
	case strings.HasPrefix(expr, claimsPlaceholder):
		path := expr[len(claimsPlaceholder):]
		if err := checkClaimPath(path); err != nil {
			return tmplPart{}, fmt.Errorf("column %d: {{%s}}: %w (functions and pipelines are not supported)", col, truncate(inner, 64), err)
		}
		return tmplPart{claim: path, col: col}, nil
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
// valid path segment on its own (idtemplate.CheckSegment), so no value
// can add a segment, climb out of its place or change the trust domain;
// the result is checked again all the same.
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
	return idtemplate.ID(b.String(), td, t.segments, "claims")
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
	if err := idtemplate.CheckSegment(s); err != nil {
		return "", fmt.Errorf("claim %q: %w", path, err)
	}
	return s, nil
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
