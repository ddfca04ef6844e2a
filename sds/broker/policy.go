package broker

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Caller is the process at the other end of the broker socket, as the
// agent attested it.
type Caller struct {
	PID int32
	UID uint32
	// ServiceAccount is "namespace/name" of the caller's pod; empty
	// outside a pod.
	ServiceAccount string
	// ID is the identity the identity map gives the caller; zero when
	// it gives none.
	ID spiffeid.ID
	// Certified: the caller also proved ID with an X509-SVID over mutual
	// TLS (the Node refuses a certificate for another ID).
	Certified bool
}

// String names the caller in logs and errors.
func (c Caller) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pid %d (uid %d", c.PID, c.UID)
	if c.ServiceAccount != "" {
		fmt.Fprintf(&b, ", service account %s", c.ServiceAccount)
	}
	if !c.ID.IsZero() {
		fmt.Fprintf(&b, ", %s", c.ID)
		if c.Certified {
			b.WriteString(" (certificate)")
		}
	}
	b.WriteString(")")
	return b.String()
}

// Policy says which callers may broker: a caller is allowed when any one
// rule matches it. The zero Policy allows nobody.
type Policy struct {
	rules []rule
}

type rule struct {
	text           string
	uid            *uint32
	serviceAccount string
	id             spiffeid.ID
}

// ParsePolicy parses broker rules, one per string:
//
//	sa:<namespace>/<name>   the caller runs in a pod with that service account
//	uid:<n>                 the caller's effective uid is n
//	spiffe://<td>/<path>    the identity map gives the caller that SPIFFE ID (and
//	                        over mutual TLS, its X509-SVID is for it)
//
// For example "sa:istio-system/ztunnel". At least one rule is needed.
func ParsePolicy(rules []string) (*Policy, error) {
	if len(rules) == 0 {
		return nil, errors.New("broker: no broker is allowed: name each one, e.g. --broker-allow sa:istio-system/ztunnel (or uid:<n>, or its SPIFFE ID)")
	}
	p := &Policy{}
	for i, text := range rules {
		r, err := parseRule(text)
		if err != nil {
			return nil, fmt.Errorf("broker: rule %d (%q): %w", i+1, printable(text), err)
		}
		p.rules = append(p.rules, r)
	}
	return p, nil
}

func parseRule(text string) (rule, error) {
	r := rule{text: text}
	kind, value, _ := strings.Cut(text, ":")
	switch kind {
	case "sa":
		ns, name, ok := strings.Cut(value, "/")
		if !ok {
			return rule{}, errors.New("want sa:<namespace>/<name>")
		}
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return rule{}, fmt.Errorf("namespace %q: %s", printable(ns), errs[0])
		}
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return rule{}, fmt.Errorf("service account %q: %s", printable(name), errs[0])
		}
		r.serviceAccount = value
	case "uid":
		n, err := strconv.ParseUint(value, 10, 32)
		if err != nil {
			return rule{}, fmt.Errorf("want uid:<number>: %w", err)
		}
		u := uint32(n)
		r.uid = &u
	case "spiffe":
		id, err := spiffeid.FromString(text)
		if err != nil {
			return rule{}, err
		}
		r.id = id
	default:
		return rule{}, errors.New("want sa:<namespace>/<name>, uid:<n> or a SPIFFE ID")
	}
	return r, nil
}

// Allows returns the first rule that matches c, and whether one did.
func (p *Policy) Allows(c Caller) (string, bool) {
	if p == nil {
		return "", false
	}
	i := slices.IndexFunc(p.rules, func(r rule) bool {
		switch {
		case r.uid != nil:
			return *r.uid == c.UID
		case r.serviceAccount != "":
			return r.serviceAccount == c.ServiceAccount
		default:
			return !c.ID.IsZero() && r.id == c.ID
		}
	})
	if i < 0 {
		return "", false
	}
	return p.rules[i].text, true
}

// String lists the rules, for logs and refusals.
func (p *Policy) String() string {
	if p == nil || len(p.rules) == 0 {
		return "(none)"
	}
	texts := make([]string, len(p.rules))
	for i, r := range p.rules {
		texts[i] = r.text
	}
	return strings.Join(texts, ", ")
}
