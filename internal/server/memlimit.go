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

// serverBallastSize is the server's floor under the heap the garbage
// collector paces against, on top of the binary's (cmd/trustbridge's
// gcBallastSize, 8 MiB, which every command has). A CA under load
// allocates about 30 KiB a certificate (CSR parsing, signing, gRPC and
// TLS) while little of it stays live, so at GOGC=100 over a small live
// heap a collection came every few hundred certificates: about 8% of the
// server's CPU per certificate (issue 40's profile). The ballast holds no
// pointers and is never written: no marking and, its pages never touched,
// no resident memory; the garbage allowed between collections grows by at
// most its size, whatever the live heap, where a higher GOGC would grow
// it with the live heap (a burst of 10,000 waiting requests).
// --memory-limit (GOMEMLIMIT) still bounds the heap: near the limit the
// collector runs as often as it must.
const serverBallastSize = 24 << 20

// tuneMemory sets the Go runtime's memory limit (SetMemoryLimit) and
// returns the ballast that raises the heap the collector paces against by
// serverBallastSize, for runServer to keep alive until it returns.
func tuneMemory(logger *slog.Logger) []byte {
	setMemoryLimit(logger, BinaryBallastSize+serverBallastSize)
	return make([]byte, serverBallastSize)
}

// BinaryBallastSize is the ballast every command of cmd/trustbridge
// holds (its gcBallastSize), which the memory limit set here leaves out.
const BinaryBallastSize = 8 << 20

// SetMemoryLimit gives the Go runtime a soft memory limit of 90% of the
// container's (the cgroup's memory limit, v1 or v2), unless GOMEMLIMIT is
// set (it wins) or AUTOMEMLIMIT=off. Without one, the garbage collector
// lets the heap grow to twice what is live before it runs, so a server
// holding its most connections would pass a 256 MiB limit that its live
// memory fits in, and be OOM-killed. automemlimit reads the cgroup
// hierarchies (v1, v2, nested and hybrid mounts) we would otherwise parse
// ourselves. Outside a container, or with no limit, nothing changes.
//
// The Go runtime counts a ballast (BinaryBallastSize, and the server's)
// against its limit although its pages are never touched, so the limit
// set from the container's is raised by the ballast: the collector then
// works harder at the same resident memory as without one. A GOMEMLIMIT
// given by the operator is left as it is.
func SetMemoryLimit(logger *slog.Logger) { setMemoryLimit(logger, BinaryBallastSize) }

func setMemoryLimit(logger *slog.Logger, ballast int64) {
	before := debug.SetMemoryLimit(-1)
	limit, err := memlimit.Set(memlimit.WithRatio(memoryLimitRatio), memlimit.WithProvider(memlimit.FromCgroup))
	switch {
	case err != nil:
		logger.Debug("no container memory limit found: the Go runtime has no soft memory limit (GOMEMLIMIT sets one)", logattr.Error, err)
	case limit != before && limit != math.MaxInt64:
		limit += ballast
		debug.SetMemoryLimit(limit)
		logger.Info("Go runtime memory limit set from the container's (90%, or AUTOMEMLIMIT's ratio, plus the untouched GC ballast)", "gomemlimit_bytes", limit, "ballast_bytes", ballast)
	}
}
