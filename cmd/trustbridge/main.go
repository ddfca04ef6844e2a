package main

import (
	"io"
	"os"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], env{in: os.Stdin, out: os.Stdout, err: os.Stderr, now: time.Now}))
}

// env is what the CLI takes from the process: streams and the clock.
// Tests pass their own.
type env struct {
	in       io.Reader
	out, err io.Writer
	now      func() time.Time
}

// run executes the CLI and returns the process exit status.
func run(args []string, e env) int {
	cmd := newRootCmd(e)
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		// Cobra's own error output is silenced so every error is printed
		// once, here, in one format.
		_, _ = io.WriteString(e.err, "trustbridge: "+err.Error()+"\n")
		return exitCode(err)
	}
	return 0
}
