//go:build linux

// Package cgrouptest makes real cgroups for tests of workload
// attestation, named as the kubelet names them, and removes them after:
// the tests run as root in CI and skip, saying why, where cgroups cannot
// be made.
package cgrouptest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// statfs(2) magic numbers of the cgroup file systems.
const (
	Cgroup1Magic = 0x27e0eb
	Cgroup2Magic = 0x63677270
)

// Hierarchy is a mounted cgroup hierarchy children are moved into.
type Hierarchy struct {
	Name  string
	Mount string
	Magic int64
}

// Hierarchies are v1's pids hierarchy and v2's unified one.
func Hierarchies() []Hierarchy {
	return []Hierarchy{{"v1 pids", "/sys/fs/cgroup/pids", Cgroup1Magic}, V2()}
}

// V2 is the cgroup v2 hierarchy: beside the v1 ones on a hybrid host like
// these, else at /sys/fs/cgroup itself.
func V2() Hierarchy {
	var fs syscall.Statfs_t
	if err := syscall.Statfs("/sys/fs/cgroup/unified", &fs); err == nil && fs.Type == Cgroup2Magic {
		return Hierarchy{"v2", "/sys/fs/cgroup/unified", Cgroup2Magic}
	}
	return Hierarchy{"v2", "/sys/fs/cgroup", Cgroup2Magic}
}

// Require skips the test unless it runs as root with h mounted.
func (h Hierarchy) Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make cgroups and move processes into them")
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(h.Mount, &fs); err != nil || int64(fs.Type) != h.Magic {
		t.Skipf("no cgroup hierarchy (%s) mounted at %s (statfs: %v, type %#x)", h.Name, h.Mount, err, fs.Type)
	}
}

// Container makes the cgroup of container cid in pod podUID under h as
// the kubelet's systemd driver names it with containerd (guaranteed QoS).
func (h Hierarchy) Container(t testing.TB, podUID, cid string) string {
	t.Helper()
	return Make(t, h.Mount, "kubepods.slice",
		"kubepods-pod"+strings.ReplaceAll(podUID, "-", "_")+".slice",
		"cri-containerd-"+cid+".scope")
}

// Make makes the cgroup path under a hierarchy's mount and removes what
// it made, deepest first, when the test ends (after its processes exited:
// make it before starting them). It skips the test when the kernel
// refuses to make it. The first element may be shared with other tests on
// the machine: removing it is left to the last one out.
func Make(t testing.TB, mount string, path ...string) string {
	t.Helper()
	dir := mount
	for i, p := range path {
		dir = filepath.Join(dir, p)
		err := os.Mkdir(dir, 0o755)
		if errors.Is(err, os.ErrExist) && i < len(path)-1 {
			continue
		}
		if err != nil {
			t.Skipf("cannot make cgroup %s: %v", dir, err)
		}
		made, shared := dir, i == 0
		t.Cleanup(func() {
			err := os.Remove(made)
			if shared && (errors.Is(err, syscall.EBUSY) || errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, os.ErrNotExist)) {
				return
			}
			if err != nil {
				t.Errorf("removing cgroup %s: %v", made, err)
			}
		})
	}
	return dir
}
