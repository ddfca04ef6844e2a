package certservice

import (
	"context"
	"log/slog"
	"slices"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// Results of trustbridge_certservice_workload_dns_names_total.
const (
	dnsNamesAdded   = "added"
	dnsNamesSkipped = "skipped"
)

// workloadDNSNames are the DNS names of the certificate for id, which
// records grant g (Config.WorkloadDNSNames): only for a Kubernetes grant,
// on a first issuance or a renewal alike, so a workload renewing with its
// SVID keeps its name. A Kubernetes identity that cannot have one (a
// service account name with dots) gets its certificate without, with a
// Warn line saying why.
//
// Impersonation: a node proxy proved the target with its own Kubernetes
// token, and the Impersonator saw a pod of the target's service account
// on the proxy's node; the target is then as much a Kubernetes identity as
// if it had asked itself. The grant names the proxy's account, so the name
// is decided as if it named the target's. A proxy that authenticated with
// another kind of token gives its targets no name.
func (s *Service) workloadDNSNames(ctx context.Context, ident authn.Identity, id spiffeid.ID, g authn.Grant, hasGrant bool, peer string) []string {
	if s.cfg.WorkloadDNSNames == nil || !hasGrant || !authn.IsKubernetesMethod(g.Method) {
		return nil
	}
	if id != ident.ID && g.Method == authn.MethodKubernetesJWT {
		if ns, sa, ok := authn.ServiceAccountOf(id); ok {
			g.Ref = ns + "/" + sa
		}
	}
	names, err := s.cfg.WorkloadDNSNames.Names(id, g)
	if err != nil {
		s.metrics.dnsNames.WithLabelValues(dnsNamesSkipped).Inc()
		// A caller's own identity triggers this on every issuance; the
		// limiter of authenticated callers' lines bounds it, the metric
		// counts them all.
		s.cfg.Logger.Log(ctx, s.authedLog.Level(slog.LevelWarn), "certificate issued without a workload DNS name (--workload-dns-name-template)",
			logattr.SPIFFEID, id.String(), logattr.GrantMethod, g.Method, logattr.Address, peer, "reason", err.Error())
		return nil
	}
	if len(names) > 0 {
		s.metrics.dnsNames.WithLabelValues(dnsNamesAdded).Inc()
	}
	return names
}

// unionNames is the certificate's DNS names: those a NameImpersonator
// granted and the template's, sorted, each once, so that a name both
// give appears once and equal requests sign equal certificates.
func unionNames(granted, template []string) []string {
	if len(granted) == 0 {
		return template
	}
	return slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(granted), template...))))
}
