package identitymap

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Default is what a workload no rule selects gets.
type Default string

const (
	// DefaultIstio gives a Kubernetes workload no rule selects
	// spiffe://<td>/ns/<namespace>/sa/<service account>, the identity
	// Istio and trustbridge's certificate service give it, and other
	// workloads nothing. It is the default.
	DefaultIstio Default = "istio"
	// DefaultNone gives workloads no rule selects nothing: every identity
	// comes from a rule.
	DefaultNone Default = "none"
)

// ParseDefault accepts "istio" or "none".
func ParseDefault(s string) (Default, error) {
	switch d := Default(s); d {
	case DefaultIstio, DefaultNone:
		return d, nil
	}
	return "", fmt.Errorf("identity map default %q: want %q or %q", s, DefaultIstio, DefaultNone)
}

// TTL bounds. A rule's TTL is what its workloads' X509-SVIDs live; it is
// checked against Config.MaxTTL, the issuer's ceiling.
const (
	// MinTTL is the shortest TTL a rule may ask for: shorter SVIDs would
	// be renewed faster than the agent's rotation can serve them.
	MinTTL = time.Minute
	// DefaultMaxTTL is Config.MaxTTL when not set.
	DefaultMaxTTL = 24 * time.Hour
	// MaxDNSNames caps the DNS name templates of one rule.
	MaxDNSNames = 32
	// MaxIdentityDNSNames caps the DNS names of one Identity, every
	// matching rule's merged: they all go in one certificate, whose
	// signer bounds its names (package ca keeps room for these and the
	// server's --workload-dns-name-template name). 32 is one rule at its
	// maximum: rules that together give a workload more are a mistake,
	// and a certificate of hundreds of names would cost every handshake.
	MaxIdentityDNSNames = 32
)

// Rule gives the workloads it selects a SPIFFE ID, and optionally an
// X509-SVID TTL and DNS names, made from their facts by templates. One
// rule is one entry of the file's rules list, or one IdentityMapping
// resource (Kubernetes), as trustpolicy's ClusterTrustPolicy carries one
// trust policy rule.
type Rule struct {
	// Name identifies the rule in identities, errors, conflicts and
	// explanations: a DNS-1123 subdomain, unique across sources.
	Name string `json:"name"`
	// Origin says where the rule was written: "file:<path>:<line>" or
	// "crd:<resource name>".
	Origin string `json:"origin"`
	// Workloads selects workloads; a workload matching any selector is
	// selected. A rule must have at least one.
	Workloads []Selector `json:"workloads"`
	// SPIFFEID is the SPIFFE ID template (see the package doc).
	SPIFFEID string `json:"spiffeID"`
	// TTL is the X509-SVID lifetime; 0 leaves it to the issuer.
	TTL time.Duration `json:"ttl,omitempty"`
	// DNSNames are DNS name templates, at most MaxDNSNames.
	DNSNames []string `json:"dnsNames,omitempty"`
}

// Selector selects workloads by their attested facts. Every field that is
// set must match; a selector with none set is refused, as one that would
// select everything by accident. Kubernetes fields never match a workload
// without Kubernetes facts, unix fields one without unix facts. A
// selector of unix fields only selects host processes, never a process
// in a pod: any container can run as uid 65534 from a file it put at
// /usr/bin/node_exporter. Add kubernetes: true (or a namespace) to
// select processes in pods by their unix facts.
type Selector struct {
	// Kubernetes selects Kubernetes workloads only. Alone, it is how a
	// rule says "every Kubernetes workload".
	Kubernetes bool `json:"kubernetes,omitempty"`
	// Namespace and ServiceAccount match exactly.
	Namespace      string `json:"namespace,omitempty"`
	ServiceAccount string `json:"serviceAccount,omitempty"`
	// PodLabels is a label selector on the pod's labels (nil: not
	// checked; an empty one is refused).
	PodLabels *metav1.LabelSelector `json:"podLabels,omitempty"`
	// UID and GID match the caller's effective IDs (nil: not checked).
	UID *uint32 `json:"uid,omitempty"`
	GID *uint32 `json:"gid,omitempty"`
	// BinaryPath matches the caller's executable exactly (an absolute,
	// clean path); BinarySHA256 its digest (64 lower case hex digits).
	BinaryPath   string `json:"binaryPath,omitempty"`
	BinarySHA256 string `json:"binarySHA256,omitempty"`
}

type compiledSelector struct {
	Selector
	labels labels.Selector // nil: not checked
}

type compiledRule struct {
	Rule
	selectors []compiledSelector
	id        *template
	dns       []*template
}

// compileRule checks one rule. With a zero local trust domain and maxTTL
// (Parse, which knows neither) the checks that need them are left to
// Compile.
func compileRule(local spiffeid.TrustDomain, maxTTL time.Duration, r Rule) (compiledRule, error) {
	cr := compiledRule{Rule: r}
	if err := checkName(r.Name); err != nil {
		return cr, err
	}
	if len(r.Workloads) == 0 {
		return cr, errors.New("no workloads: a rule must select workloads (write `kubernetes: true` to select every Kubernetes workload)")
	}
	for i, s := range r.Workloads {
		cs, err := compileSelector(s)
		if err != nil {
			return cr, fmt.Errorf("workloads[%d]: %w", i, err)
		}
		cr.selectors = append(cr.selectors, cs)
	}
	if err := cr.compileTemplates(local); err != nil {
		return cr, err
	}
	return cr, checkTTL(r.TTL, maxTTL)
}

// checkName accepts a rule name: a DNS-1123 subdomain, as resource names.
func checkName(name string) error {
	if name == "" {
		return errors.New("no name")
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("name %q: %s", name, strings.Join(errs, "; "))
	}
	return nil
}

func (cr *compiledRule) compileTemplates(local spiffeid.TrustDomain) error {
	if cr.SPIFFEID == "" {
		return errors.New("no spiffeID template")
	}
	id, err := parseIDTemplate(cr.SPIFFEID)
	if err != nil {
		return fmt.Errorf("spiffeID: %w", err)
	}
	if !local.IsZero() {
		if err := id.checkTrustDomain(local); err != nil {
			return fmt.Errorf("spiffeID: %w", err)
		}
	}
	cr.id = id
	if len(cr.DNSNames) > MaxDNSNames {
		return fmt.Errorf("dnsNames: %d names, more than %d", len(cr.DNSNames), MaxDNSNames)
	}
	for i, s := range cr.DNSNames {
		t, err := parseDNSTemplate(s)
		if err != nil {
			return fmt.Errorf("dnsNames[%d]: %w", i, err)
		}
		cr.dns = append(cr.dns, t)
	}
	return nil
}

func checkTTL(ttl, maxTTL time.Duration) error {
	switch {
	case ttl == 0:
		return nil
	case ttl < MinTTL:
		return fmt.Errorf("ttl %s: shorter than the minimum %s", ttl, MinTTL)
	case maxTTL > 0 && ttl > maxTTL:
		return fmt.Errorf("ttl %s: longer than the maximum %s", ttl, maxTTL)
	}
	return nil
}

func compileSelector(s Selector) (compiledSelector, error) {
	cs := compiledSelector{Selector: s}
	if !s.Kubernetes && s.Namespace == "" && s.ServiceAccount == "" && s.PodLabels == nil &&
		s.UID == nil && s.GID == nil && s.BinaryPath == "" && s.BinarySHA256 == "" {
		return cs, errors.New("empty selector: set kubernetes, namespace, serviceAccount, podLabels, uid, gid, binaryPath or binarySHA256 (kubernetes: true alone selects every Kubernetes workload)")
	}
	if err := checkSelectorValues(s); err != nil {
		return cs, err
	}
	if s.PodLabels != nil {
		// An empty selector would select every pod: too broad to be what
		// anyone meant; kubernetes: true says it.
		if len(s.PodLabels.MatchLabels) == 0 && len(s.PodLabels.MatchExpressions) == 0 {
			return cs, errors.New("podLabels: empty label selector; set matchLabels or matchExpressions (kubernetes: true selects every Kubernetes workload)")
		}
		sel, err := metav1.LabelSelectorAsSelector(s.PodLabels)
		if err != nil {
			return cs, fmt.Errorf("podLabels: %w", err)
		}
		cs.labels = sel
	}
	return cs, nil
}

func checkSelectorValues(s Selector) error {
	if errs := validation.IsDNS1123Label(s.Namespace); s.Namespace != "" && len(errs) > 0 {
		return fmt.Errorf("namespace %q: %s", s.Namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(s.ServiceAccount); s.ServiceAccount != "" && len(errs) > 0 {
		return fmt.Errorf("serviceAccount %q: %s", s.ServiceAccount, strings.Join(errs, "; "))
	}
	if p := s.BinaryPath; p != "" && (!path.IsAbs(p) || path.Clean(p) != p) {
		return fmt.Errorf("binaryPath %q: want an absolute, clean path", truncate(p, 64))
	}
	if h := s.BinarySHA256; h != "" && (len(h) != 64 || strings.IndexFunc(h, func(r rune) bool { return !('0' <= r && r <= '9' || 'a' <= r && r <= 'f') }) >= 0) {
		return fmt.Errorf("binarySHA256 %q: want 64 lower case hex digits", truncate(h, 80))
	}
	return nil
}

// kube reports whether the selector reads Kubernetes facts.
func (s compiledSelector) kube() bool {
	return s.Kubernetes || s.Namespace != "" || s.ServiceAccount != "" || s.PodLabels != nil
}

// unix reports whether the selector reads unix facts.
func (s compiledSelector) unix() bool {
	return s.UID != nil || s.GID != nil || s.BinaryPath != "" || s.BinarySHA256 != ""
}

// matches reports whether w has every fact s asks for. A selector with
// no Kubernetes field matches host processes only.
func (s compiledSelector) matches(w *Workload) bool {
	if s.kube() != w.Kubernetes || s.kube() && !s.matchesKube(w) {
		return false
	}
	return !s.unix() || s.matchesUnix(w)
}

func (s compiledSelector) matchesKube(w *Workload) bool {
	switch {
	case !w.Kubernetes:
		return false
	case s.Namespace != "" && s.Namespace != w.Namespace:
		return false
	case s.ServiceAccount != "" && s.ServiceAccount != w.ServiceAccount:
		return false
	}
	// A pod whose labels are not known matches no label selector, even
	// one of DoesNotExist only.
	return s.labels == nil || w.PodLabels != nil && s.labels.Matches(labels.Set(w.PodLabels))
}

func (s compiledSelector) matchesUnix(w *Workload) bool {
	switch {
	case !w.Unix:
		return false
	case s.UID != nil && *s.UID != w.UID, s.GID != nil && *s.GID != w.GID:
		return false
	case s.BinaryPath != "" && s.BinaryPath != w.BinaryPath:
		return false
	}
	return s.BinarySHA256 == "" || s.BinarySHA256 == w.BinarySHA256
}

// fields names the facts s checks, for explanations: "namespace",
// "podLabels", "uid".
func (s compiledSelector) fields() []string {
	var out []string
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"kubernetes", s.Kubernetes}, {"namespace", s.Namespace != ""}, {"serviceAccount", s.ServiceAccount != ""},
		{"podLabels", s.PodLabels != nil}, {"uid", s.UID != nil}, {"gid", s.GID != nil},
		{"binaryPath", s.BinaryPath != ""}, {"binarySHA256", s.BinarySHA256 != ""},
	} {
		if f.set {
			out = append(out, f.name)
		}
	}
	return out
}
