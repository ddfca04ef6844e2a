package attest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// maxCgroupSize bounds /proc/<pid>/cgroup: a line per v1 controller plus
// the v2 line, each path a few hundred bytes on a real node.
const maxCgroupSize = 64 << 10

// cgroupPlace is the pod and container /proc/<pid>/cgroup puts a process
// in; both empty when it is not in a pod.
type cgroupPlace struct {
	podUID      string // canonical form, with dashes
	containerID string // 64 lowercase hex digits
}

func (p cgroupPlace) inPod() bool { return p.podUID != "" }

// parseCgroup reads the content of /proc/<pid>/cgroup
// ("hierarchy-ID:controllers:path" lines, cgroup v1 and v2) and returns the
// pod and container the process runs in, or a zero cgroupPlace when no
// line puts it in a pod. Lines that place it in a pod must all agree.
// Lines that do not are ignored beside them: on hybrid hosts the v2 line
// or a controller the runtime does not manage stays at the node's path,
// and only a writer to the host's cgroup.procs, already root on the node,
// can move a process between cgroups.
//
// Anything ambiguous fails: a pod cgroup without a container below it
// (the pod's own cgroup), CRI-O's conmon, a malformed pod UID or container
// ID, a path under kubepods in a shape not known here, two pods in one
// path, a path climbing out of the reader's cgroup namespace ("/..")
// without naming a pod. A process in the reader's own cgroup ("/" in a
// cgroup namespace) reads as outside any pod: run the agent in the host's
// cgroup namespace, or trust nobody in its own container.
func parseCgroup(b []byte) (cgroupPlace, error) {
	if len(b) > maxCgroupSize {
		return cgroupPlace{}, fmt.Errorf("cgroup file is over %d bytes", maxCgroupSize)
	}
	s := strings.TrimSuffix(string(b), "\n")
	if s == "" {
		return cgroupPlace{}, errors.New("cgroup file is empty")
	}
	var found cgroupPlace
	for n, line := range strings.Split(s, "\n") {
		p, err := parseCgroupLine(line)
		if err != nil {
			return cgroupPlace{}, fmt.Errorf("cgroup line %d (%q): %w", n+1, truncate(line), err)
		}
		switch {
		case !p.inPod():
		case !found.inPod():
			found = p
		case p != found:
			return cgroupPlace{}, fmt.Errorf("cgroup line %d (%q) disagrees with an earlier line (pod %s, container %s)", n+1, truncate(line), found.podUID, found.containerID)
		}
	}
	return found, nil
}

func parseCgroupLine(line string) (cgroupPlace, error) {
	parts := strings.SplitN(line, ":", 3)
	if len(parts) != 3 {
		return cgroupPlace{}, errors.New("not hierarchy-ID:controllers:path")
	}
	if !isDigits(parts[0]) {
		return cgroupPlace{}, errors.New("hierarchy ID is not a number")
	}
	path := parts[2]
	if !strings.HasPrefix(path, "/") {
		return cgroupPlace{}, errors.New("path is not absolute")
	}
	return parseCgroupPath(path)
}

// parseCgroupPath finds the pod segment, in the systemd driver's form
// (kubepods[-<qos>]-pod<uid with underscores>.slice, below any prefix such
// as kind's kubelet-) or the cgroupfs driver's (pod<uid> below kubepods,
// its QoS class, or ".." in a cgroup namespace), and the container segment
// right after it. Segments below the container (cgroups a workload made
// inside its own) are allowed: it cannot leave its container's subtree.
func parseCgroupPath(path string) (cgroupPlace, error) {
	segs := strings.Split(path[1:], "/")
	pod := -1
	var uid string
	for i, seg := range segs {
		u, ok, err := podSegment(segs, i)
		if err != nil {
			return cgroupPlace{}, fmt.Errorf("segment %q: %w", truncate(seg), err)
		}
		if !ok {
			continue
		}
		if pod >= 0 {
			return cgroupPlace{}, errors.New("path names two pods")
		}
		pod, uid = i, u
	}
	if pod < 0 {
		switch {
		case strings.Contains(path, "kubepods"):
			return cgroupPlace{}, errors.New("under kubepods but not in a pod's cgroup")
		case slices.Contains(segs, ".."):
			// Seen from a cgroup namespace (an agent in a pod on cgroup
			// v2): "/../cri-containerd-<id>.scope" is a container of the
			// agent's own pod, whose pod segment is above the namespace's
			// root. Nothing here can tell that from a host process.
			return cgroupPlace{}, errors.New("relative to this agent's cgroup namespace and names no pod: cannot tell whether the caller is in one")
		}
		return cgroupPlace{}, nil
	}
	if pod+1 >= len(segs) || segs[pod+1] == "" {
		return cgroupPlace{}, errors.New("in the pod's own cgroup, not in a container")
	}
	id, err := containerSegment(segs[pod+1])
	if err != nil {
		return cgroupPlace{}, fmt.Errorf("segment %q: %w", truncate(segs[pod+1]), err)
	}
	return cgroupPlace{podUID: uid, containerID: id}, nil
}

// podSegment reports whether segs[i] names a pod, and its UID.
func podSegment(segs []string, i int) (string, bool, error) {
	seg := segs[i]
	if name, ok := strings.CutSuffix(seg, ".slice"); ok {
		at := strings.LastIndex(name, "-pod")
		if at < 0 || !strings.Contains(name[:at], "kubepods") {
			return "", false, nil
		}
		raw := name[at+len("-pod"):]
		if strings.Contains(raw, "-") || !isUUID(strings.ReplaceAll(raw, "_", "-")) {
			return "", false, errors.New("pod UID is not a UUID with underscores")
		}
		return strings.ReplaceAll(raw, "_", "-"), true, nil
	}
	raw, ok := strings.CutPrefix(seg, "pod")
	if !ok || i == 0 {
		return "", false, nil
	}
	switch segs[i-1] {
	case "kubepods", "burstable", "besteffort", "..":
	default:
		return "", false, nil
	}
	if !isUUID(raw) {
		return "", false, errors.New("pod UID is not a UUID")
	}
	return raw, true, nil
}

// containerSegment returns the container ID a container's cgroup is named
// after: <id> (cgroupfs driver), or cri-containerd-<id>, crio-<id> or
// docker-<id>, with or without .scope (systemd driver).
func containerSegment(seg string) (string, error) {
	name := strings.TrimSuffix(seg, ".scope")
	if strings.HasPrefix(name, "crio-conmon-") {
		return "", errors.New("CRI-O's conmon, not a container")
	}
	for _, prefix := range []string{"cri-containerd-", "crio-", "docker-"} {
		if id, ok := strings.CutPrefix(name, prefix); ok {
			name = id
			break
		}
	}
	if !isContainerID(name) {
		return "", errors.New("not a container's cgroup (want 64 hex digits, optionally cri-containerd-, crio- or docker-)")
	}
	return name, nil
}

// isUUID reports whether s is a UUID in the lowercase canonical form the
// API server writes (8-4-4-4-12 hex digits).
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := range len(s) {
		switch i {
		case 8, 13, 18, 23:
			if s[i] != '-' {
				return false
			}
		default:
			if !isLowerHex(s[i]) {
				return false
			}
		}
	}
	return true
}

func isContainerID(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := range len(s) {
		if !isLowerHex(s[i]) {
			return false
		}
	}
	return true
}

func isLowerHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' }

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// truncate keeps error messages about hostile input short.
func truncate(s string) string {
	const max = 200
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
