package nodeauth

import (
	"fmt"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
)

// mapped grants target when the identity map gives it to a running pod on
// node: the pod's facts as the API server has them (identitymap.ServerFacts:
// no container, no unix facts) must make Identify return exactly target.
// A rule that needs facts only the agent attests never selects a pod here
// or fails it, so its IDs are never granted: fail closed.
func (a *Authorizer) mapped(caller authn.Identity, node string, target spiffeid.ID) error {
	if a.mapReady != nil && !a.mapReady() {
		return fmt.Errorf("nodeauth: the identity map's ClusterIdentityMapping resources not read yet: %w", authn.ErrUnavailable)
	}
	m := a.idmap.Load()
	if m == nil {
		return fmt.Errorf("nodeauth: no identity map loaded yet: %w", authn.ErrUnavailable)
	}
	if target.TrustDomain() != a.td {
		return fmt.Errorf("nodeauth: %w: %s is not of trust domain %s", ErrNotAuthorized, target, a.td.Name())
	}
	pods, err := a.informer.GetIndexer().ByIndex(indexNode, node)
	if err != nil {
		return fmt.Errorf("nodeauth: %w", err)
	}
	seen := 0
	for _, obj := range pods {
		p, ok := obj.(*corev1.Pod)
		if !ok || !running(p) {
			continue
		}
		seen++
		ident, err := m.Identify(podFacts(p))
		if err == nil && ident.ID == target {
			return nil
		}
	}
	return fmt.Errorf("nodeauth: %w: the identity map gives %s to none of the %d running pods on node %s, where %s runs (trustbridge identity explain shows what a pod gets)",
		ErrNotAuthorized, target, seen, node, caller.ID)
}

// podFacts is what the server knows of p for the identity map.
func podFacts(p *corev1.Pod) identitymap.Workload {
	return identitymap.ServerFacts(p.Namespace, serviceAccountOf(p), p.Name, string(p.UID), p.Spec.NodeName, p.Labels)
}
