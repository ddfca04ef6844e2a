package server

import (
	"log/slog"
	"math"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"

	"github.com/trustbridge/trustbridge/internal/logattr"
)

// memoryLimitRatio is the share of the container's memory limit the Go
// runtime aims to stay under, the rest left for what it does not manage
// (the binary, thread stacks, the kernel's socket buffers).
const memoryLimitRatio = 0.9

// SetMemoryLimit gives the Go runtime a soft memory limit of 90% of the
// container's (the cgroup's memory limit, v1 or v2), unless GOMEMLIMIT is
// set (it wins) or AUTOMEMLIMIT=off. Without one, the garbage collector
// lets the heap grow to twice what is live before it runs, so a server
// holding its most connections would pass a 256 MiB limit that its live
// memory fits in, and be OOM-killed. automemlimit reads the cgroup
// hierarchies (v1, v2, nested and hybrid mounts) we would otherwise parse
// ourselves. Outside a container, or with no limit, nothing changes.
func SetMemoryLimit(logger *slog.Logger) {
	before := debug.SetMemoryLimit(-1)
	limit, err := memlimit.Set(memlimit.WithRatio(memoryLimitRatio), memlimit.WithProvider(memlimit.FromCgroup))
	switch {
	case err != nil:
		logger.Debug("no container memory limit found: the Go runtime has no soft memory limit (GOMEMLIMIT sets one)", logattr.Error, err)
	case limit != before && limit != math.MaxInt64:
		logger.Info("Go runtime memory limit set from the container's (90%, or AUTOMEMLIMIT's ratio)", "gomemlimit_bytes", limit)
	}
}
