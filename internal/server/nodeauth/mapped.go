package nodeauth

import (
	"fmt"
	"slices"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
)

// grant is what an impersonation asks the identity map for: an ID and,
// when withNames, exactly dnsNames (sorted, each once, as
// identitymap.Identity.DNSNames).
type grant struct {
	id        spiffeid.ID
	dnsNames  []string
	withNames bool
}

// givenBy reports whether ident is what g asks for. Names compare as
// sets, so one pod's names are never granted with another's ID: two pods
// of one ID may have different names, and a caller may have the names of
// the pod it asks for, not their union.
func (g grant) givenBy(ident identitymap.Identity) bool {
	return ident.ID == g.id && (!g.withNames || slices.Equal(ident.DNSNames, g.dnsNames))
}

// mapped grants g when the identity map gives it to a running pod on
// node: the pod's facts as the API server has them (identitymap.ServerFacts:
// no container, no unix facts) must make Identify return exactly g's ID
// (and names). A rule that needs facts only the agent attests never selects
// a pod here or fails it, so its IDs are never granted: fail closed.
func (a *Authorizer) mapped(caller authn.Identity, node string, g grant) error {
	m, err := a.loadMap()
	if err != nil {
		return err
	}
	if g.id.TrustDomain() != a.td {
		return fmt.Errorf("nodeauth: %w: %s is not of trust domain %s", ErrNotAuthorized, g.id, a.td.Name())
	}
	pods, err := a.informer.GetIndexer().ByIndex(indexNode, node)
	if err != nil {
		return fmt.Errorf("nodeauth: %w", err)
	}
	seen, sameID := 0, 0
	for _, obj := range pods {
		p, ok := obj.(*corev1.Pod)
		if !ok || !running(p) {
			continue
		}
		seen++
		ident, err := m.Identify(podFacts(p))
		if err == nil && g.givenBy(ident) {
			return nil
		}
		if err == nil && ident.ID == g.id {
			sameID++
		}
	}
	if g.withNames && sameID > 0 {
		return fmt.Errorf("nodeauth: %w: the identity map gives %s with exactly the DNS names %q to none of the %d running pods on node %s, where %s runs; "+
			"%d of them get that ID with other names (a request must carry exactly the names one pod gets; trustbridge identity explain shows them)",
			ErrNotAuthorized, g.id, g.dnsNames, seen, node, caller.ID, sameID)
	}
	return fmt.Errorf("nodeauth: %w: the identity map gives %s to none of the %d running pods on node %s, where %s runs (trustbridge identity explain shows what a pod gets)",
		ErrNotAuthorized, g.id, seen, node, caller.ID)
}

// loadMap is the identity map in force, or an error wrapping
// authn.ErrUnavailable while it does not hold every source yet.
func (a *Authorizer) loadMap() (*identitymap.Map, error) {
	if a.mapReady != nil && !a.mapReady() {
		return nil, fmt.Errorf("nodeauth: the identity map's ClusterIdentityMapping resources not read yet: %w", authn.ErrUnavailable)
	}
	m := a.idmap.Load()
	if m == nil {
		return nil, fmt.Errorf("nodeauth: no identity map loaded yet: %w", authn.ErrUnavailable)
	}
	return m, nil
}

// podFacts is what the server knows of p for the identity map.
func podFacts(p *corev1.Pod) identitymap.Workload {
	return identitymap.ServerFacts(p.Namespace, serviceAccountOf(p), p.Name, string(p.UID), p.Spec.NodeName, p.Labels)
}
