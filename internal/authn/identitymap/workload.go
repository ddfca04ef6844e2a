package identitymap

import (
	"errors"
	"fmt"
	"strconv"
)

// Errors of Map.Identify, always wrapped with the details: which rules
// were considered, which matched, which fact was missing. They are stable
// metric labels and gRPC code inputs for the caller; no fact value that
// could be a secret is in any message.
var (
	// ErrNoIdentity means no rule selects the workload and the default
	// gives it nothing (a non-Kubernetes caller, DefaultNone).
	ErrNoIdentity = errors.New("no identity for this workload")
	// ErrConflict means two rules that select the workload make different
	// SPIFFE IDs: neither is picked.
	ErrConflict = errors.New("rules give this workload different SPIFFE IDs")
	// ErrFacts means a rule that selects the workload needs a fact the
	// workload does not have, or has in a form its template refuses (a
	// missing pod label, a value with "/" in an ID path segment).
	ErrFacts = errors.New("the workload's facts do not fill a rule's template")
)

// Workload is what attestation proved about a caller: its Kubernetes
// facts when it runs in a pod, its unix facts when they were read from
// its socket and /proc. The agent fills it from its attestor's facts, the
// server from what authenticated the caller (a service account token
// proves Namespace and ServiceAccount only). A fact whose group flag is
// false is unknown, never zero: a uid selector of 0 does not match a
// Workload without Unix.
type Workload struct {
	// Kubernetes says the caller is in a pod: the fields up to Image are
	// the pod's as the API server has them ("" where not known). PodLabels
	// is nil when the pod is not known, which no label selector matches;
	// a known pod without labels has an empty map.
	Kubernetes     bool              `json:"kubernetes"`
	Namespace      string            `json:"namespace,omitempty"`
	ServiceAccount string            `json:"serviceAccount,omitempty"`
	PodName        string            `json:"podName,omitempty"`
	PodUID         string            `json:"podUID,omitempty"`
	PodLabels      map[string]string `json:"podLabels,omitempty"`
	NodeName       string            `json:"nodeName,omitempty"`
	ContainerName  string            `json:"containerName,omitempty"`
	Image          string            `json:"image,omitempty"`

	// Unix says UID and GID are the caller's, read from its socket; User,
	// Group, BinaryPath and BinarySHA256 (hex) are "" where not known.
	Unix         bool   `json:"unix"`
	UID          uint32 `json:"uid"`
	GID          uint32 `json:"gid"`
	User         string `json:"user,omitempty"`
	Group        string `json:"group,omitempty"`
	BinaryPath   string `json:"binaryPath,omitempty"`
	BinarySHA256 string `json:"binarySHA256,omitempty"`
}

// describe names the workload in an error, by the facts an operator
// would write a rule for: "pod payments/api-7d9 (service account api)",
// "uid 1000, /usr/bin/exporter".
func (w Workload) describe() string {
	switch {
	case w.Kubernetes && w.Namespace != "":
		return fmt.Sprintf("pod %s/%s (service account %q)", w.Namespace, w.PodName, w.ServiceAccount)
	case w.Kubernetes:
		return fmt.Sprintf("pod UID %q (its pod not known)", w.PodUID)
	case w.Unix && w.BinaryPath != "":
		return fmt.Sprintf("uid %d, %s", w.UID, w.BinaryPath)
	case w.Unix:
		return "uid " + strconv.FormatUint(uint64(w.UID), 10)
	}
	return "a workload with no attested facts"
}
