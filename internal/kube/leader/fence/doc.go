// Package fence keeps a replica that does not lead from writing shared
// state: the one lease-bounded writer under ca/kubestore (the CA Secret)
// and federation/kubelkg (the last-known-good ConfigMaps), and the one
// ErrNotLeader they refuse with.
//
// A write is refused while the Leader says this replica does not lead,
// and is bounded by when the Leader stops counting itself the leader
// (leader.Elector's LeadingUntil): a write that fails past that instant
// may have been abandoned after another replica took over, and is
// reported as ErrNotLeader, not as the API error it met.
//
//	w := fence.Writer{Leader: elector, Timeout: 10 * time.Second}
//	if err := w.Check("write"); err != nil {
//		return err // errors.Is(err, fence.ErrNotLeader)
//	}
//	err := w.Write(func(ctx context.Context) error { return update(ctx) })
//
// It has no Kubernetes dependency of its own, so that ca can name its
// ErrNotLeader without depending on client-go. The idea is the fencing of
// Kubernetes' leader election (client-go's leaderelection package: act
// only while the lease is held, stop before RenewDeadline).
package fence
