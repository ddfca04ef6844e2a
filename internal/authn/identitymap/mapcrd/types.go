package mapcrd

import (
	"errors"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/kube/crdcontroller"
)

// The resource.
const (
	Group    = "trustbridge.dev"
	Version  = "v1alpha1"
	Resource = "clusteridentitymappings"
	Kind     = "ClusterIdentityMapping"
)

// GVR names the resource for the dynamic client.
var GVR = schema.GroupVersionResource{Group: Group, Version: Version, Resource: Resource}

// Size limits of a spec, the CRD schema's maxItems
// (deploy/base/identitymapping-crd.yaml), checked here too for a CRD
// installed without its schema.
const (
	MaxWorkloads = 64
	// MaxConflicts is how many conflicts a status lists.
	MaxConflicts = 20
)

// ClusterIdentityMapping is one identity map rule; its name is the rule's
// name.
type ClusterIdentityMapping struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              Spec   `json:"spec"`
	Status            Status `json:"status,omitempty"`
}

// Spec is an identity map rule without its name (the --identity-map
// file's schema).
type Spec struct {
	Workloads []WorkloadSelector `json:"workloads"`
	SPIFFEID  string             `json:"spiffeID"`
	// TTL is a Go duration; "" leaves it to the issuer.
	TTL      string   `json:"ttl,omitempty"`
	DNSNames []string `json:"dnsNames,omitempty"`
}

// WorkloadSelector is an identitymap.Selector. UID and GID are int64 as
// JSON numbers decode; they are checked to fit 32 bits.
type WorkloadSelector struct {
	Kubernetes     bool                  `json:"kubernetes,omitempty"`
	Namespace      string                `json:"namespace,omitempty"`
	ServiceAccount string                `json:"serviceAccount,omitempty"`
	PodLabels      *metav1.LabelSelector `json:"podLabels,omitempty"`
	UID            *int64                `json:"uid,omitempty"`
	GID            *int64                `json:"gid,omitempty"`
	BinaryPath     string                `json:"binaryPath,omitempty"`
	BinarySHA256   string                `json:"binarySHA256,omitempty"`
}

// Status says whether the rule is accepted and what is at odds with it.
type Status struct {
	ObservedGeneration int64              `json:"observedGeneration,omitempty"`
	Conditions         []metav1.Condition `json:"conditions,omitempty"`
	// SPIFFEID is the template of the rule in force.
	SPIFFEID string `json:"spiffeID,omitempty"`
	// ServerChecks is unset when no rule is in force; false when only the
	// node agent can evaluate the rule (identitymap.Map.AgentOnly).
	ServerChecks *bool `json:"serverChecks,omitempty"`
	// Conflicts are the other rules that may select the same workload
	// with a different SPIFFE ID.
	Conflicts []string `json:"conflicts,omitempty"`
}

// Condition type and reasons.
const (
	ConditionReady = crdcontroller.ConditionReady

	// ReasonAccepted: the rule is in force.
	ReasonAccepted = "Accepted"
	// ReasonInvalid: the spec is refused; the message names the field.
	ReasonInvalid = crdcontroller.ReasonInvalid
	// ReasonRefused: the rules together were refused (a name another
	// source's rule has), so this one is not in force.
	ReasonRefused = "Refused"
)

// words are how statuses, events and the resources metric name the
// outcomes.
var words = crdcontroller.Words{
	InForce: ReasonAccepted, NotInForce: ReasonRefused, NotInForceNote: "not in force", Kept: "stays in force",
	NoneKept: "; no valid generation to keep: the workloads it would select get what the other rules and the default give them",
}

// OriginPrefix starts the Origin of every rule a resource makes.
const OriginPrefix = "crd:"

// RuleOf is the rule the resource named name makes; it checks only what
// the conversion needs (the TTL's and ids' syntax).
func RuleOf(name string, spec Spec) (identitymap.Rule, error) {
	r := identitymap.Rule{Name: name, Origin: OriginPrefix + name, SPIFFEID: spec.SPIFFEID, DNSNames: spec.DNSNames}
	if spec.TTL != "" {
		d, err := time.ParseDuration(spec.TTL)
		if err != nil || d <= 0 {
			return r, fmt.Errorf("spec.ttl %q: want a positive Go duration such as 1h or 30m", spec.TTL)
		}
		r.TTL = d
	}
	if n := len(spec.Workloads); n > MaxWorkloads {
		return r, fmt.Errorf("spec.workloads: %d selectors, at most %d; split the rule into several resources", n, MaxWorkloads)
	}
	for i, w := range spec.Workloads {
		s := identitymap.Selector{Kubernetes: w.Kubernetes, Namespace: w.Namespace, ServiceAccount: w.ServiceAccount,
			PodLabels: w.PodLabels.DeepCopy(), BinaryPath: w.BinaryPath, BinarySHA256: w.BinarySHA256}
		var err error
		if s.UID, err = id32(w.UID); err != nil {
			return r, fmt.Errorf("spec.workloads[%d].uid: %w", i, err)
		}
		if s.GID, err = id32(w.GID); err != nil {
			return r, fmt.Errorf("spec.workloads[%d].gid: %w", i, err)
		}
		r.Workloads = append(r.Workloads, s)
	}
	return r, nil
}

func id32(v *int64) (*uint32, error) {
	if v == nil {
		return nil, nil
	}
	if *v < 0 || *v > 1<<32-1 {
		return nil, fmt.Errorf("%d: want 0 to 4294967295", *v)
	}
	u := uint32(*v)
	return &u, nil
}

// Check checks r, a rule RuleOf made, alone (identitymap.Compile with this
// rule only), so that one bad resource never refuses the others. The
// error names the spec field: "spec.workloads[0]: empty selector ...".
func Check(cfg identitymap.Config, r identitymap.Rule) error {
	_, err := identitymap.Compile(cfg, []identitymap.Rule{r})
	if err == nil {
		return nil
	}
	msg, ok := strings.CutPrefix(err.Error(), fmt.Sprintf("identitymap: rule 1 %q (%s): ", r.Name, r.Origin))
	if !ok {
		return err // not about the rule: the configuration
	}
	if strings.HasPrefix(msg, "workloads") || strings.HasPrefix(msg, "spiffeID") || strings.HasPrefix(msg, "dnsNames") {
		return errors.New("spec." + msg)
	}
	if strings.HasPrefix(msg, "ttl") {
		return errors.New("spec." + msg)
	}
	if strings.HasPrefix(msg, "name") {
		return errors.New("metadata." + msg)
	}
	return errors.New("spec: " + msg)
}
