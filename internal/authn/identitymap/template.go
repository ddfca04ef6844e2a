package identitymap

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/trustbridge/trustbridge/internal/authn/idtemplate"
)

// The template language of spiffeID and dnsNames: literal text plus
// placeholders {{.Fact}} (spaces inside the braces allowed), nothing
// else, the same shape as the OIDC issuers' SPIFFE ID templates
// (internal/authn/oidc). It is deliberately not text/template: no
// functions, pipelines or conditionals, so a reviewer sees every ID a
// template can make, and a fact can only ever fill the place its
// placeholder holds.
const (
	tdPlaceholder     = ".TrustDomain"
	labelsPlaceholder = ".PodLabels."
	spiffePrefix      = "spiffe://"
)

// fact is one placeholder's source: a Kubernetes or a unix fact.
type fact struct {
	kube bool
	get  func(*Workload) string
}

// facts are the placeholders besides .TrustDomain and .PodLabels.<key>.
// BinaryPath and Image hold "/" and ":", which no ID segment may, so they
// are for selectors only.
var facts = map[string]fact{
	"Namespace":      {true, func(w *Workload) string { return w.Namespace }},
	"ServiceAccount": {true, func(w *Workload) string { return w.ServiceAccount }},
	"PodName":        {true, func(w *Workload) string { return w.PodName }},
	"PodUID":         {true, func(w *Workload) string { return w.PodUID }},
	"NodeName":       {true, func(w *Workload) string { return w.NodeName }},
	"ContainerName":  {true, func(w *Workload) string { return w.ContainerName }},
	"UID":            {false, func(w *Workload) string { return strconv.FormatUint(uint64(w.UID), 10) }},
	"GID":            {false, func(w *Workload) string { return strconv.FormatUint(uint64(w.GID), 10) }},
	"User":           {false, func(w *Workload) string { return w.User }},
	"Group":          {false, func(w *Workload) string { return w.Group }},
}

// placeholders lists every placeholder a template may use, for help
// texts and errors.
func placeholders() []string {
	out := []string{"{{" + tdPlaceholder + "}}", "{{" + labelsPlaceholder + "<key>}}"}
	names := make([]string, 0, len(facts))
	for n := range facts {
		names = append(names, "{{."+n+"}}")
	}
	sort.Strings(names)
	return append(out, names...)
}

// part is a literal, the trust domain, a fact or a pod label.
type part struct {
	lit   string
	td    bool
	fact  string // a key of facts, or "PodLabels"
	label string // the pod label's key
	col   int    // 1-based byte column of a placeholder's {{, for errors
}

func (p part) placeholder() bool { return p.td || p.fact != "" }

// text is the placeholder as canonically written, or the literal.
func (p part) text() string {
	switch {
	case p.td:
		return "{{" + tdPlaceholder + "}}"
	case p.label != "":
		return "{{" + labelsPlaceholder + p.label + "}}"
	case p.fact != "":
		return "{{." + p.fact + "}}"
	}
	return p.lit
}

// template is a parsed SPIFFE ID or DNS name template.
type template struct {
	src   string
	parts []part
	// literalTD is the trust domain an ID template names literally, ""
	// when it uses {{.TrustDomain}}; Compile requires it to be the local
	// one.
	literalTD string
	// segments is the number of path segments of every ID it makes.
	segments int
}

// lex splits s into literal text and placeholders.
func lex(s string) ([]part, error) {
	return idtemplate.Lex(s, func(lit string) part { return part{lit: lit} }, placeholder)
}

// placeholder reads what is between {{ and }}, found at column col.
func placeholder(inner string, col int) (part, error) {
	expr := strings.Trim(inner, " ")
	switch {
	case expr == tdPlaceholder:
		return part{td: true, col: col}, nil
	case strings.HasPrefix(expr, labelsPlaceholder):
		key := expr[len(labelsPlaceholder):]
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			return part{}, fmt.Errorf("column %d: {{%s}}: %q is not a label key: %s (functions and pipelines are not supported)", col, truncate(inner, 64), truncate(key, 64), strings.Join(errs, "; "))
		}
		return part{fact: "PodLabels", label: key, col: col}, nil
	case strings.HasPrefix(expr, ".") && facts[expr[1:]].get != nil:
		return part{fact: expr[1:], col: col}, nil
	}
	return part{}, fmt.Errorf("column %d: {{%s}} is not one of %s (nothing else is supported)", col, truncate(inner, 64), strings.Join(placeholders(), ", "))
}

// parseIDTemplate parses and checks a SPIFFE ID template: it must start
// with "spiffe://{{.TrustDomain}}/" or "spiffe://<trust domain>/", and
// its path, with each fact taken as a valid segment, must be a valid
// non-root SPIFFE ID path. Errors name the 1-based byte column.
func parseIDTemplate(s string) (*template, error) {
	if len(s) > idtemplate.MaxTemplateLen {
		return nil, fmt.Errorf("template is %d bytes, more than %d", len(s), idtemplate.MaxTemplateLen)
	}
	parts, err := lex(s)
	if err != nil {
		return nil, err
	}
	t := &template{src: s, parts: parts}
	if err := t.checkIDShape(); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *template) errStart() error {
	return fmt.Errorf("template %q must start with %s{{%s}}/ or %s<trust domain>/", truncate(t.src, 64), spiffePrefix, tdPlaceholder, spiffePrefix)
}

// checkIDShape checks the scheme, trust domain and path of an ID
// template, each fact standing for a one-byte segment, and counts its
// segments.
func (t *template) checkIDShape() error {
	if len(t.parts) == 0 || t.parts[0].placeholder() || !strings.HasPrefix(t.parts[0].lit, spiffePrefix) {
		return t.errStart()
	}
	rest := t.parts[1:]
	afterScheme := strings.TrimPrefix(t.parts[0].lit, spiffePrefix)
	var path strings.Builder
	if afterScheme == "" {
		if len(rest) == 0 || !rest[0].td {
			return t.errStart()
		}
		rest = rest[1:]
	} else {
		td, p, ok := strings.Cut(afterScheme, "/")
		if _, err := spiffeid.TrustDomainFromString(td); err != nil || !ok {
			return fmt.Errorf("template %q: %q is not a trust domain followed by /", truncate(t.src, 64), truncate(td, 64))
		}
		t.literalTD = td
		path.WriteString("/" + p)
	}
	if err := t.writeSkeleton(&path, rest, "/", "path segment"); err != nil {
		return err
	}
	skeleton := path.String()
	if err := spiffeid.ValidatePath(skeleton); err != nil || skeleton == "" {
		return fmt.Errorf("template %q: the path (facts standing for one valid segment each) must be a non-root SPIFFE ID path of / separated segments of A-Z a-z 0-9 . - _ (no . or .. segments, no empty ones)", truncate(t.src, 64))
	}
	t.segments = strings.Count(skeleton, "/")
	return nil
}

// writeSkeleton writes parts to b, each fact standing for "x", refusing
// {{.TrustDomain}} and a second fact in one unit (a path segment or DNS
// label, separated by sep): values side by side cannot be told apart once
// joined ({{.Namespace}}-{{.PodName}} is the same for a-b/c and a/b-c).
func (t *template) writeSkeleton(b *strings.Builder, parts []part, sep, unit string) error {
	inUnit := 0
	for _, p := range parts {
		switch {
		case p.td:
			return fmt.Errorf("column %d: {{%s}} is only allowed as the trust domain", p.col, tdPlaceholder)
		case p.fact != "":
			if inUnit++; inUnit > 1 {
				return fmt.Errorf("column %d: %s is a second placeholder in one %s, which is ambiguous "+
					"({{.Namespace}}-{{.PodName}} is the same for namespace a-b, pod c and namespace a, pod b-c); "+
					"give each its own %s (literal text beside one is fine)", p.col, p.text(), unit, unit)
			}
			b.WriteString("x")
		default:
			if strings.Contains(p.lit, sep) {
				inUnit = 0
			}
			b.WriteString(p.lit)
		}
	}
	return nil
}

// checkTrustDomain refuses an ID template that names a trust domain other
// than td.
func (t *template) checkTrustDomain(td spiffeid.TrustDomain) error {
	if t.literalTD != "" && t.literalTD != td.Name() {
		return fmt.Errorf("template names trust domain %q, not the local %q; use {{%s}}", t.literalTD, td.Name(), tdPlaceholder)
	}
	return nil
}

// canonical is the template as written with canonical spacing and the
// local trust domain as {{.TrustDomain}}: two templates with equal
// canonical forms make equal IDs from equal facts.
func (t *template) canonical() string {
	var b strings.Builder
	for i, p := range t.parts {
		if i == 0 && t.literalTD != "" {
			b.WriteString(spiffePrefix + "{{" + tdPlaceholder + "}}" + strings.TrimPrefix(p.lit, spiffePrefix+t.literalTD))
			continue
		}
		b.WriteString(p.text())
	}
	return b.String()
}

// render fills the template from w, each fact checked by check.
func (t *template) render(td spiffeid.TrustDomain, w *Workload, check func(string) error) (string, error) {
	var b strings.Builder
	for _, p := range t.parts {
		if !p.placeholder() {
			b.WriteString(p.lit)
			continue
		}
		if p.td {
			b.WriteString(td.Name())
			continue
		}
		v, err := value(w, p)
		if err == nil {
			err = check(v)
		}
		if err != nil {
			return "", fmt.Errorf("%s: %w", p.text(), err)
		}
		b.WriteString(v)
	}
	return b.String(), nil
}

// value is the fact p names, or why the workload has none.
func value(w *Workload, p part) (string, error) {
	if p.label != "" {
		if !w.Kubernetes {
			return "", errors.New("not a Kubernetes workload")
		}
		v, ok := w.PodLabels[p.label]
		if !ok {
			return "", fmt.Errorf("the pod has no label %q", p.label)
		}
		return v, nil
	}
	f := facts[p.fact]
	switch {
	case f.kube && !w.Kubernetes:
		return "", errors.New("not a Kubernetes workload")
	case !f.kube && !w.Unix:
		return "", errors.New("no unix facts attested")
	}
	v := f.get(w)
	if v == "" {
		return "", errors.New("not known for this workload")
	}
	return v, nil
}

// id builds the SPIFFE ID for w. Every fact must be a valid path segment
// on its own (idtemplate.CheckSegment), so no value can add a segment,
// climb out of its place or change the trust domain; the result is
// checked again all the same.
func (t *template) id(td spiffeid.TrustDomain, w *Workload) (spiffeid.ID, error) {
	s, err := t.render(td, w, idtemplate.CheckSegment)
	if err != nil {
		return spiffeid.ID{}, err
	}
	return idtemplate.ID(s, td, t.segments, "facts")
}

// truncate shortens s for an error message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
