// Package leader elects one leader among trustbridge replicas with a
// coordination.k8s.io Lease, through client-go's leaderelection.
//
// Only the leader changes shared state (CA rotation, federation polling);
// followers serve what it wrote. IsLeader is the write fence: it turns
// false as soon as the lease may have lapsed (RenewDeadline after the last
// renewal that began, well inside LeaseDuration, after which another
// replica may take over), not when the elector gets round to noticing.
// Writers of shared state go through fence.Writer (internal/kube/leader/fence),
// which also bounds each write by LeadingUntil.
//
//	el, err := leader.New(leader.Config{Client: cs, Namespace: ns, Registerer: reg})
//	go el.Run(ctx, func(ctx context.Context) error {
//		authority.Recheck()   // rotate now if due
//		return poller.Run(ctx) // ends the moment leadership is lost
//	})
package leader
