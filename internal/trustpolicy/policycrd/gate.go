package policycrd

import (
	"context"
	"log/slog"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// Gate makes SDS fail closed until the ClusterTrustPolicy resources
// have been read: until then a resource limiting a trust domain may not be
// known yet, so every caller gets the local trust domain only (a restart
// or a failover must not hand every workload every federated trust domain
// for as long as the informer takes, or forever when it cannot list).
type Gate struct {
	access *trustpolicy.Access
	synced <-chan struct{}
	local  *trustpolicy.Policy // no rules, default deny: the local trust domain only
}

// NewGate gates access until synced (Controller.Synced) is closed.
func NewGate(access *trustpolicy.Access, synced <-chan struct{}, td spiffeid.TrustDomain) (*Gate, error) {
	local, err := trustpolicy.Compile(td, trustpolicy.DefaultDeny, nil)
	if err != nil {
		return nil, err
	}
	return &Gate{access: access, synced: synced, local: local}, nil
}

// Decide is the Access's decision once the resources were read, and the
// local trust domain only before, with a channel that fires when they are.
func (g *Gate) Decide(ident authn.Identity) (trustpolicy.Decision, <-chan struct{}) {
	select {
	case <-g.synced:
		return g.access.Decide(ident)
	default:
		return g.local.Decide(trustpolicy.SubjectOf(ident)), g.synced
	}
}

// Watch warns when the resources were not read within warnAfter, and
// says when they are. It returns only when ctx is done: the server is a
// runall group, where any part that returns stops every other.
func (g *Gate) Watch(ctx context.Context, warnAfter time.Duration, logger *slog.Logger) error {
	g.warnUntilSynced(ctx, warnAfter, logger)
	<-ctx.Done()
	return nil
}

func (g *Gate) warnUntilSynced(ctx context.Context, warnAfter time.Duration, logger *slog.Logger) {
	t := time.NewTimer(warnAfter)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-g.synced:
		return
	case <-t.C:
	}
	logger.Warn("ClusterTrustPolicy resources not read yet: SDS hands every workload only the local trust domain until they are; check that the CRD is installed (deploy/base/trustpolicy-crd.yaml), the server may list clustertrustpolicies, and the trust-policy-crd logs",
		"waited", warnAfter.String())
	select {
	case <-ctx.Done():
	case <-g.synced:
		logger.Info("ClusterTrustPolicy resources read: SDS applies the trust policy")
	}
}
