package agent

import (
	"context"
	"fmt"
)

// CheckSocket takes step 1 of Run's decision flow alone: it returns
// ErrAlreadyServing (wrapped) when an SDS server already answers on the
// socket, an error when some other gRPC server does, and nil when Run
// would go on. A caller that starts things beside the agent (an admin
// listener on a fixed port) asks first, so that a second agent exits 0
// as Istio's flow says instead of failing on the port the first holds.
// Run probes again: the answer may change in between.
func (a *Agent) CheckSocket(ctx context.Context) error {
	st, err := probeSocket(ctx, a.socketPath, a.probeTimeout)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	switch st {
	case socketSDS:
		return fmt.Errorf("agent: %w: %s", ErrAlreadyServing, a.socketPath)
	case socketOtherGRPC:
		return fmt.Errorf("agent: a gRPC server without SDS answers on %s; not replacing it", a.socketPath)
	}
	return nil
}
