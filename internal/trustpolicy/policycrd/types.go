package policycrd

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/trustbridge/trustbridge/internal/kube/crdcontroller"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// The resource.
const (
	Group    = "trustbridge.dev"
	Version  = "v1alpha1"
	Resource = "clustertrustpolicies"
	Kind     = "ClusterTrustPolicy"
)

// GVR names the resource for the dynamic client.
var GVR = schema.GroupVersionResource{Group: Group, Version: Version, Resource: Resource}

// Size limits of a spec. The CRD's schema (deploy/base/trustpolicy-crd.yaml)
// has the same maxItems, and a test holds the two equal; the controller
// checks them too, for a CRD installed without its schema.
const (
	MaxWorkloads    = 64
	MaxTrustDomains = 64
	MaxPeers        = 256
	// MaxRecent is how many recently matched SPIFFE IDs a status lists.
	MaxRecent = 20
	// MaxConflicts is how many conflicts a status lists.
	MaxConflicts = 20
)

// ClusterTrustPolicy is one trust policy rule; its name is the rule's name.
type ClusterTrustPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              Spec   `json:"spec"`
	Status            Status `json:"status,omitempty"`
}

// Spec is a trust policy rule without its name (the policy file's schema).
type Spec struct {
	// Workloads selects local workloads; any selector may match.
	Workloads []WorkloadSelector `json:"workloads"`
	// TrustDomains are granted to the selected workloads.
	TrustDomains []TrustDomainGrant `json:"trustDomains"`
}

// WorkloadSelector is a trustpolicy.Selector: every field set must match.
type WorkloadSelector struct {
	SPIFFEID  string                `json:"spiffeID,omitempty"`
	Namespace string                `json:"namespace,omitempty"`
	Labels    *metav1.LabelSelector `json:"labels,omitempty"`
}

// TrustDomainGrant is a trustpolicy.TrustDomainGrant.
type TrustDomainGrant struct {
	Name  string   `json:"name"`
	Peers []string `json:"peers,omitempty"`
}

// Status says whether the rule is applied, whom it matched and what it
// grants.
type Status struct {
	ObservedGeneration int64              `json:"observedGeneration,omitempty"`
	Conditions         []metav1.Condition `json:"conditions,omitempty"`
	// MatchedWorkloads is unset when the server does not record matches.
	MatchedWorkloads *MatchedWorkloads `json:"matchedWorkloads,omitempty"`
	// TrustDomains are the trust domains the applied rule grants.
	TrustDomains []string `json:"trustDomains,omitempty"`
	// Conflicts are what the server found at odds with other rules.
	Conflicts []string `json:"conflicts,omitempty"`
}

// MatchedWorkloads counts the workloads the rule selected since the server
// started, with the SPIFFE IDs of the last few.
type MatchedWorkloads struct {
	Count  int64    `json:"count"`
	Recent []string `json:"recent,omitempty"`
}

// Condition type and reasons.
const (
	ConditionReady = crdcontroller.ConditionReady

	ReasonApplied  = "Applied"
	ReasonInvalid  = crdcontroller.ReasonInvalid
	ReasonConflict = "Conflict"
)

// words are how statuses, events and the resources metric name the
// outcomes.
var words = crdcontroller.Words{
	InForce: ReasonApplied, NotInForce: ReasonConflict, NotInForceNote: "not applied", Kept: "stays applied",
	StandinKept: "; no valid generation to keep: it grants nothing, and the trust domains it names stay withheld from every workload no other rule grants them to",
}

// OriginPrefix starts the Origin of every rule a resource makes.
const OriginPrefix = "crd:"

// RuleOf is the rule resource name's spec makes. It does not check it.
func RuleOf(name string, spec Spec) trustpolicy.Rule {
	r := trustpolicy.Rule{Name: RuleName(name), Origin: OriginPrefix + name}
	for _, w := range spec.Workloads {
		r.Workloads = append(r.Workloads, trustpolicy.Selector{SPIFFEID: w.SPIFFEID, Namespace: w.Namespace, Labels: w.Labels.DeepCopy()})
	}
	for _, g := range spec.TrustDomains {
		r.TrustDomains = append(r.TrustDomains, trustpolicy.TrustDomainGrant{TrustDomain: g.Name, Peers: slices.Clone(g.Peers)})
	}
	return r
}

// RuleNamePrefix begins the rule name of every resource: a file or
// --config rule name is a DNS subdomain, which has no "/", so a resource
// and a file rule can never clash by name (a clash would make the policy
// refuse every later change of the resources, revocations included).
const RuleNamePrefix = "clustertrustpolicy/"

// RuleName is the rule name of the resource named name.
func RuleName(name string) string { return RuleNamePrefix + name }

// Check checks r, a rule RuleOf made, alone (trustpolicy.Compile with
// this rule only), so that one bad resource never refuses the others.
// The error names the spec field: "spec.trustDomains[1].peers[0]: ...".
func Check(local spiffeid.TrustDomain, r trustpolicy.Rule) error {
	if err := checkSize(r); err != nil {
		return err
	}
	_, err := trustpolicy.Compile(local, trustpolicy.DefaultAllow, []trustpolicy.Rule{r})
	if err == nil {
		return nil
	}
	msg, ok := strings.CutPrefix(err.Error(), fmt.Sprintf("trustpolicy: rule 1 %q (%s): ", r.Name, r.Origin))
	if !ok {
		return err // not about the rule: the local trust domain
	}
	return errors.New(fieldOf(msg))
}

func checkSize(r trustpolicy.Rule) error {
	if n := len(r.Workloads); n > MaxWorkloads {
		return fmt.Errorf("spec.workloads: %d selectors, at most %d; split the rule into several resources", n, MaxWorkloads)
	}
	if n := len(r.TrustDomains); n > MaxTrustDomains {
		return fmt.Errorf("spec.trustDomains: %d trust domains, at most %d; split the rule into several resources", n, MaxTrustDomains)
	}
	for i, g := range r.TrustDomains {
		if n := len(g.Peers); n > MaxPeers {
			return fmt.Errorf("spec.trustDomains[%d].peers: %d peers, at most %d; use path prefixes (spiffe://td/ns/x/*)", i, n, MaxPeers)
		}
	}
	return nil
}

// fieldRewrites turn trustpolicy.Compile's positions within a rule into the
// resource's field paths. A message they do not know keeps its position,
// which still names the list element.
var fieldRewrites = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`^(workloads\[\d+\]): labels: `), "$1.labels: "},
	{regexp.MustCompile(`^(workloads\[\d+\]): (pattern |spiffeID )`), "$1.spiffeID: $2"},
	{regexp.MustCompile(`^(trustDomains\[\d+\]): (peers\[\d+\]): `), "$1.$2: "},
	{regexp.MustCompile(`^(trustDomains\[\d+\]): (trust domain )`), "$1.name: $2"},
	{regexp.MustCompile(`^no (workloads|trustDomains): `), "$1: "},
}

func fieldOf(msg string) string {
	for _, fr := range fieldRewrites {
		if fr.re.MatchString(msg) {
			msg = fr.re.ReplaceAllString(msg, fr.repl)
			break
		}
	}
	if strings.HasPrefix(msg, "workloads") || strings.HasPrefix(msg, "trustDomains") {
		return "spec." + msg
	}
	return "spec: " + msg
}
