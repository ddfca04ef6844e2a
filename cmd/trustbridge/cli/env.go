package cli

import (
	"io"
	"os"
	"time"
)

// Env is what the CLI takes from the process: streams, the clock and
// SIGHUP. Tests pass their own.
type Env struct {
	In       io.Reader
	Out, Err io.Writer
	Now      func() time.Time
	// HUP delivers SIGHUP to the commands that reload on it (server,
	// agent); nil: they subscribe to the process's (hupSignals).
	HUP <-chan os.Signal
}
