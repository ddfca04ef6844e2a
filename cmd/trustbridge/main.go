package main

import (
	"io"
	"os"
	"runtime"
	"time"

	// Mozilla's roots, pinned with this module, for where the system has
	// none (the container image is an empty base): https_web federation and
	// ACME verify with them. Go uses them only when the system pool is
	// empty, so a host's own roots (a corporate CA) still win; and the
	// image no longer carries whatever CA file its build host had.
	_ "golang.org/x/crypto/x509roots/fallback"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server"
)

// gcBallastSize is a floor under the heap the garbage collector paces
// against. Package initialisation (client-go's scheme, Envoy's protos)
// leaves about 3 MiB live, so at GOGC=100 a collection came every 3 MiB
// allocated, each marking those 3 MiB: on the bundle endpoint that was
// about 5% of the CPU per request a small static server does not spend
// (issue 20 item 6, BENCHMARKS.md). The ballast holds no pointers and is
// never written, so it costs no marking and, its pages never touched, no
// resident memory; the extra heap between collections is bounded by its
// size whatever the live heap.
// The Go runtime's memory limit set from a container's leaves it out
// (server.SetMemoryLimit).
const gcBallastSize = server.BinaryBallastSize

func main() {
	ballast := make([]byte, gcBallastSize)
	code := run(os.Args[1:], cli.Env{In: os.Stdin, Out: os.Stdout, Err: os.Stderr, Now: time.Now})
	runtime.KeepAlive(ballast)
	os.Exit(code)
}

// run executes the CLI and returns the process exit status.
func run(args []string, e cli.Env) int {
	cmd := newRootCmd(e)
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		// Cobra's own error output is silenced so every error is printed
		// once, here, in one format.
		_, _ = io.WriteString(e.Err, "trustbridge: "+err.Error()+"\n")
		return cli.ExitCode(err)
	}
	return 0
}
