// Package poll runs a check on a fixed interval. trustbridge polls files
// it reloads (plug-in CA directories, bundle files, TLS certificates)
// instead of watching them: Kubernetes Secret volumes swap a symlink that
// file watches miss.
package loop

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// Run calls check every interval until ctx is done, then returns nil.
// check reports its own failures (log, LastError); they never end Run.
func Poll(ctx context.Context, clk clock.WithTicker, interval time.Duration, check func()) error {
	t := clk.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			check()
		}
	}
}
