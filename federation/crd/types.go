package crd

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/trustbridge/trustbridge/federation"
)

// The resource.
const (
	Group    = "trustbridge.dev"
	Version  = "v1alpha1"
	Resource = "clusterfederatedtrustdomains"
	Kind     = "ClusterFederatedTrustDomain"
)

// GVR names the resource for the dynamic client.
var GVR = schema.GroupVersionResource{Group: Group, Version: Version, Resource: Resource}

// ClusterFederatedTrustDomain is one federation relationship.
type ClusterFederatedTrustDomain struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              Spec   `json:"spec"`
	Status            Status `json:"status,omitempty"`
}

// Spec takes spire-controller-manager's field names; Refresh is ours.
type Spec struct {
	TrustDomain           string         `json:"trustDomain"`
	BundleEndpointURL     string         `json:"bundleEndpointURL"`
	BundleEndpointProfile Profile        `json:"bundleEndpointProfile"`
	TrustDomainBundle     string         `json:"trustDomainBundle,omitempty"`
	ClassName             string         `json:"className,omitempty"`
	Refresh               *RefreshBounds `json:"refresh,omitempty"`
}

// Profile is the federation profile and, for https_spiffe, the endpoint's
// SPIFFE ID.
type Profile struct {
	Type             string `json:"type"`
	EndpointSPIFFEID string `json:"endpointSPIFFEID,omitempty"`
}

// RefreshBounds clamps this endpoint's polling interval (Go durations).
type RefreshBounds struct {
	Min string `json:"min,omitempty"`
	Max string `json:"max,omitempty"`
}

// Status is what the server's /v1/federation reports for the trust domain,
// plus the conditions Ready and Stale.
type Status struct {
	ObservedGeneration  int64              `json:"observedGeneration,omitempty"`
	State               string             `json:"state,omitempty"`
	EndpointURL         string             `json:"endpointURL,omitempty"`
	Sequence            *int64             `json:"sequence,omitempty"`
	LastAttempt         *metav1.Time       `json:"lastAttempt,omitempty"`
	LastSuccess         *metav1.Time       `json:"lastSuccess,omitempty"`
	NextRefresh         *metav1.Time       `json:"nextRefresh,omitempty"`
	LastError           string             `json:"lastError,omitempty"`
	ConsecutiveFailures int                `json:"consecutiveFailures,omitempty"`
	Authorities         []Authority        `json:"authorities,omitempty"`
	Conditions          []metav1.Condition `json:"conditions,omitempty"`
}

// Authority is one trusted authority.
type Authority struct {
	Kind     string       `json:"kind"`
	SHA256   string       `json:"sha256"`
	Subject  string       `json:"subject,omitempty"`
	KeyID    string       `json:"keyID,omitempty"`
	NotAfter *metav1.Time `json:"notAfter,omitempty"`
}

// Condition types and reasons.
const (
	ConditionReady = "Ready"
	ConditionStale = "Stale"

	ReasonInvalidSpec = "InvalidSpec"
	ReasonConflict    = "Conflict"
	ReasonPending     = "Pending"
	ReasonFetched     = "Fetched"
	ReasonFailing     = "Failing"
	ReasonStale       = "NoRecentSuccess"
	ReasonFresh       = "Fresh"
)

// StateInvalid is the status state of a resource whose spec is refused.
const StateInvalid = "invalid"

// configItem is a spec in the YAML form federation.ParseConfig reads (JSON
// is YAML), so a resource obeys exactly the rules of the file form.
type configItem struct {
	TrustDomain           string         `json:"trustDomain"`
	BundleEndpointURL     string         `json:"bundleEndpointURL"`
	BundleEndpointProfile map[string]any `json:"bundleEndpointProfile"`
	TrustDomainBundle     *string        `json:"trustDomainBundle,omitempty"`
	Refresh               map[string]any `json:"refresh,omitempty"`
}

// linePrefix is what ParseConfig puts before its message for a file.
var linePrefix = regexp.MustCompile(`^(federation: )?line \d+: federation\[0\]( \([^)]*\))?: `)

// Endpoint validates spec and returns the endpoint it configures.
func Endpoint(spec Spec) (federation.Endpoint, []string, error) {
	item := configItem{
		TrustDomain: spec.TrustDomain, BundleEndpointURL: spec.BundleEndpointURL,
		BundleEndpointProfile: map[string]any{"type": spec.BundleEndpointProfile.Type},
	}
	if spec.BundleEndpointProfile.EndpointSPIFFEID != "" {
		item.BundleEndpointProfile["endpointSPIFFEID"] = spec.BundleEndpointProfile.EndpointSPIFFEID
	}
	if spec.TrustDomainBundle != "" {
		b := spec.TrustDomainBundle
		item.TrustDomainBundle = &b
	}
	if r := spec.Refresh; r != nil {
		item.Refresh = map[string]any{}
		if r.Min != "" {
			item.Refresh["min"] = r.Min
		}
		if r.Max != "" {
			item.Refresh["max"] = r.Max
		}
	}
	doc, err := json.Marshal(map[string]any{"federation": []configItem{item}})
	if err != nil {
		return federation.Endpoint{}, nil, err
	}
	cfg, err := federation.ParseConfig(doc, nil)
	if err != nil {
		return federation.Endpoint{}, nil, fmt.Errorf("%s", linePrefix.ReplaceAllString(err.Error(), ""))
	}
	if len(cfg.Endpoints) != 1 {
		return federation.Endpoint{}, nil, fmt.Errorf("spec yields %d endpoints, want 1", len(cfg.Endpoints))
	}
	warnings := make([]string, len(cfg.Warnings))
	for i, w := range cfg.Warnings {
		warnings[i] = strings.TrimPrefix(linePrefix.ReplaceAllString(w, ""), "federation[0]: ")
	}
	return cfg.Endpoints[0], warnings, nil
}
