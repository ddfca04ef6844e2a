package certservice

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"strings"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/svidcheck"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// chainPEM is the response's cert_chain in istiod's layout: the leaf and
// each intermediate as signed, one PEM certificate per element, then every
// root the certificate of id should trust under d (rootsElement)
// concatenated into ONE last element. Istio's agent takes that last
// element as its whole root bundle when its CA client has no separate root
// fetch (the citadel client has none): one element per root would leave a
// sidecar trusting only the last root, dropping the one in use during a
// rotation.
func (s *Service) chainPEM(issued *ca.Issued, id spiffeid.ID, d trustpolicy.Decision) []string {
	n := max(len(issued.Chain)-len(issued.Roots), 1)
	out := make([]string, 0, n+1)
	for _, c := range issued.Chain[:n] {
		out = append(out, encode(c))
	}
	if roots := s.rootsElement(id.TrustDomain(), issued.Chain[n:], d); roots != "" {
		out = append(out, roots)
	}
	return out
}

// rootsDecision is the trust policy decision the roots handed out with a
// certificate of id follow (Config.MergedRoots), the one SDS and
// WatchBundles follow for the same workload: decisionSubject's. Without
// merged roots nothing is decided: the signing roots are every caller's.
func (s *Service) rootsDecision(ident authn.Identity, id spiffeid.ID) trustpolicy.Decision {
	if !s.cfg.MergedRoots {
		return trustpolicy.Decision{}
	}
	d, _ := s.decide(decisionSubject(ident, id))
	return d
}

// decisionSubject is whom the trust of id is decided for when ident asks
// for it: ident itself, or, for a node proxy acting for a workload of its
// node (impersonation), that workload, decided as if it had asked itself,
// as its DNS name is (workloadDNSNames): a certificate's roots and a
// bundle stream carry the workload's trust, not the proxy's.
func decisionSubject(ident authn.Identity, id spiffeid.ID) authn.Identity {
	if id == ident.ID {
		return ident
	}
	target := authn.Identity{ID: id}
	if ns, sa, ok := authn.ServiceAccountOf(id); ok && ident.Method == authn.MethodKubernetesJWT {
		// The Impersonator saw a pod of this service account on the
		// proxy's node, as TokenReview would have for the pod.
		target.Method = ident.Method
		target.Grant = &authn.Grant{Method: authn.MethodKubernetesJWT, Ref: ns + "/" + sa}
	}
	return target
}

// rootsElement is cert_chain's last element for a certificate of trust
// domain local: signing, then, with Config.MergedRoots, mergedRoots under
// d, each root once, as concatenated PEM. It is built once per trust,
// decision and signing roots (merged trust can hold thousands of roots)
// and reused.
func (s *Service) rootsElement(local spiffeid.TrustDomain, signing []*x509.Certificate, d trustpolicy.Decision) string {
	var (
		bundles []*spiffebundle.Bundle
		changed <-chan struct{}
	)
	if s.cfg.MergedRoots {
		bundles, changed = s.cfg.Bundles.Bundles()
	}
	key := local.Name() + "|" + d.Key() + "|" + rootsDigest(signing)
	// build never fails.
	p, _ := s.rootsElems.get(bundles, changed, key, func() (string, error) {
		return encodeRoots(signing, mergedRoots(local, bundles, d)), nil
	})
	return p
}

// mergedRoots is the trust allowedTrust keeps under d as one flat list,
// for a client that takes a single root list: local's roots first, then
// each other trust domain's in the order of bundles. A federated root any
// of whose URI SANs is a SPIFFE ID (with or without a path) of a trust
// domain other than the one it was published for is left out, whatever
// its other SANs: a client that tells roots apart by a SAN would take a
// peer's root claiming spiffe://<local> for one of ours. Roots naming no
// trust domain (plug-in CAs) stay. A trust domain d allows
// only for some peers is left out, as from WatchBundles: a flat list cannot
// limit peers.
func mergedRoots(local spiffeid.TrustDomain, bundles []*spiffebundle.Bundle, d trustpolicy.Decision) []*x509.Certificate {
	keep, _ := allowedTrust(local, bundles, d)
	var roots []*x509.Certificate
	for _, b := range keep {
		if b.TrustDomain() == local {
			roots = append(roots, b.X509Authorities()...)
		}
	}
	for _, b := range keep {
		if b.TrustDomain() == local {
			continue
		}
		for _, r := range b.X509Authorities() {
			if svidcheck.RootNamesOnly(r, b.TrustDomain()) {
				roots = append(roots, r)
			}
		}
	}
	return roots
}

// encodeRoots is the PEM of every root of lists, in order, each once.
func encodeRoots(lists ...[]*x509.Certificate) string {
	var b strings.Builder
	seen := make(map[string]bool)
	for _, list := range lists {
		for _, c := range list {
			if c == nil || seen[string(c.Raw)] {
				continue
			}
			seen[string(c.Raw)] = true
			b.WriteString(encode(c))
		}
	}
	return b.String()
}

// rootsDigest tells sets of signing roots apart in cache keys.
func rootsDigest(roots []*x509.Certificate) string {
	h := sha256.New()
	for _, c := range roots {
		if c != nil {
			sum := sha256.Sum256(c.Raw)
			h.Write(sum[:])
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

func encode(c *x509.Certificate) string {
	var b bytes.Buffer
	// pem.Encode fails only on invalid headers, and there are none.
	_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	return b.String()
}
