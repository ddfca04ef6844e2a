package attest

// Facts are what attestation learned about a caller. A server decides
// which identity, if any, they grant.
type Facts struct {
	// PID is the caller's pid, for logs: it names the process only while
	// the connection lasts.
	PID  int32
	Unix UnixFacts
	// Kubernetes is nil for a caller outside any pod.
	Kubernetes *KubernetesFacts
}

// UnixFacts come from the socket and /proc.
type UnixFacts struct {
	// UID and GID are the caller's effective IDs when it connected.
	UID uint32
	GID uint32
	// User and Group are their names in the agent's user database, empty
	// where it has none (common for containers' users).
	User  string
	Group string
	// BinaryPath and BinarySHA256 (hex) name the caller's executable; set
	// only with Config.Binary. A caller that execs another program after
	// connecting is described by the program running at attestation.
	BinaryPath   string
	BinarySHA256 string
}

// KubernetesFacts come from the caller's cgroups (PodUID, ContainerID)
// and from its Pod as the API server has it. With no Config.Pods only
// PodUID and ContainerID are set.
type KubernetesFacts struct {
	PodUID      string
	ContainerID string

	Namespace      string
	PodName        string
	ServiceAccount string
	Labels         map[string]string
	// ContainerName, and its Image as the pod spec names it; ImageID is
	// the runtime's resolved image from the container's status.
	ContainerName string
	Image         string
	ImageID       string
}
