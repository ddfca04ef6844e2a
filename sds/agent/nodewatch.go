package agent

import (
	"context"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// trustWatch follows each workload's trust on the certificate service's
// WatchBundles, impersonating it with the node's token.
func (a *Agent) trustWatch(node func() (NodeCredentials, error)) trustWatchFunc {
	return func(ctx context.Context, id spiffeid.ID, fn func(workloadTrust, error) error) error {
		return status.Error(codes.Unimplemented, "not yet")
	}
}
