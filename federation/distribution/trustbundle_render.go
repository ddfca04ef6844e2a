package distribution

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/trustbridge/trustbridge/federation/trust"
)

// Labels and annotations on our ClusterTrustBundles. Pods select one trust
// domain's bundle with the trust domain label (in a clusterTrustBundle
// projection, beside our signer name); the annotation holds the trust
// domain whatever its length, as a label value holds at most 63
// characters.
const (
	TrustDomainLabel      = "trustbridge.io/trust-domain"
	TrustDomainAnnotation = "trustbridge.io/trust-domain"
)

// maxTrustBundleBytes is the API server's limit on a ClusterTrustBundle's
// trustBundle (1 MiB).
const maxTrustBundleBytes = 1 << 20

// Reasons a trust domain has no ClusterTrustBundle, the reason label of
// trustbridge_cluster_trust_bundles_skipped.
const (
	reasonNoCAAuthorities = "no_ca_authorities"
	reasonNameCollision   = "name_collision"
	// reasonTooLarge (the ConfigMap's reason) is shared: over 1 MiB.
)

// wantedBundle is the ClusterTrustBundle of one trust domain.
type wantedBundle struct {
	trustDomain string
	pem         string
	labels      map[string]string
	// dropped counts the trust domain's X.509 authorities left out for
	// not being CA certificates.
	dropped int
}

// bundleSkip is a trust domain left without a ClusterTrustBundle.
type bundleSkip struct {
	trustDomain, reason string
	err                 error
}

// renderTrustBundles is the ClusterTrustBundle of every trust domain of sn,
// keyed by name. Each holds the trust domain's own X.509 authorities and
// nothing else (SPIFFE Federation §7.3): one bundle per trust domain, never
// a merged pool. The API server accepts only CA certificates without
// duplicates, so an authority that is not a CA is left out (a trust domain
// left with none gets no bundle) and duplicates are dropped; a bundle over
// 1 MiB is left out whole.
func renderTrustBundles(sn *trust.Snapshot, signer string) (map[string]wantedBundle, []bundleSkip) {
	want := map[string]wantedBundle{}
	var skips []bundleSkip
	collided := map[string]bool{}
	for _, td := range sn.TrustDomains() {
		b, _ := sn.Bundle(td)
		w, skip := renderTrustBundle(td, b.X509Authorities(), signer)
		if skip != nil {
			skips = append(skips, *skip)
			continue
		}
		name := trustBundleName(signer, td)
		if other, ok := want[name]; ok || collided[name] {
			// Two trust domains, one name (a peer named like another's
			// hash): neither gets a bundle, rather than one under the
			// other's name.
			for _, t := range []string{other.trustDomain, w.trustDomain} {
				if t != "" {
					skips = append(skips, bundleSkip{t, reasonNameCollision, fmt.Errorf("its ClusterTrustBundle name %s is another trust domain's too", name)})
				}
			}
			delete(want, name)
			collided[name] = true
			continue
		}
		want[name] = w
	}
	return want, skips
}

func renderTrustBundle(td spiffeid.TrustDomain, roots []*x509.Certificate, signer string) (wantedBundle, *bundleSkip) {
	name := td.Name()
	var buf bytes.Buffer
	var seen [][]byte
	dropped := 0
	// In DER order: a peer that only reorders its roots changes nothing.
	roots = slices.SortedFunc(slices.Values(roots), func(a, b *x509.Certificate) int { return bytes.Compare(a.Raw, b.Raw) })
	for _, c := range roots {
		if !c.BasicConstraintsValid || !c.IsCA {
			dropped++
			continue
		}
		if slices.ContainsFunc(seen, func(raw []byte) bool { return bytes.Equal(raw, c.Raw) }) {
			continue
		}
		seen = append(seen, c.Raw)
		_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	switch {
	case len(seen) == 0:
		return wantedBundle{}, &bundleSkip{name, reasonNoCAAuthorities,
			fmt.Errorf("none of its %d X.509 authorities is a CA certificate (basic constraints, CA bit)", len(roots))}
	case buf.Len() > maxTrustBundleBytes:
		return wantedBundle{}, &bundleSkip{name, reasonTooLarge,
			fmt.Errorf("its %d CA certificates are %d bytes of PEM, over the ClusterTrustBundle limit of %d", len(seen), buf.Len(), maxTrustBundleBytes)}
	}
	labels := map[string]string{ManagedByLabel: ManagedByValue}
	if len(validation.IsValidLabelValue(name)) == 0 {
		labels[TrustDomainLabel] = name
	}
	return wantedBundle{trustDomain: name, pem: buf.String(), labels: labels, dropped: dropped}, nil
}

// trustBundleName is the ClusterTrustBundle name of td under signer: the
// signer name with its slashes as colons (the API server requires it of a
// signer-linked bundle), then the trust domain where it is a DNS subdomain
// (as the API server requires of the rest), else a hash of it (a trust
// domain may hold '_', or start with '-' or '.'); a trust domain that
// itself starts with "td-" is hashed too, so that no trust domain's name
// is another's hash.
func trustBundleName(signer string, td spiffeid.TrustDomain) string {
	prefix := strings.ReplaceAll(signer, "/", ":") + ":"
	name := td.Name()
	if len(validation.IsDNS1123Subdomain(name)) > 0 || strings.HasPrefix(name, "td-") {
		sum := sha256.Sum256([]byte(name))
		name = "td-" + hex.EncodeToString(sum[:16])
	}
	return prefix + name
}

// CheckSignerName refuses a signer name the API server would refuse on
// every ClusterTrustBundle: DOMAIN/PATH, the domain a DNS subdomain of at
// least two labels, the path dot-separated DNS subdomains.
func CheckSignerName(signer string) error {
	domain, path, ok := strings.Cut(signer, "/")
	if !ok || strings.Contains(path, "/") {
		return fmt.Errorf("signer name %q: want DOMAIN/PATH with one slash, e.g. trustbridge.io/svid", signer)
	}
	if errs := validation.IsDNS1123Subdomain(domain); len(errs) > 0 || !strings.Contains(domain, ".") {
		return fmt.Errorf("signer name %q: the domain %q must be a DNS name of at least two labels (%s)", signer, domain, strings.Join(errs, "; "))
	}
	for _, seg := range strings.Split(path, ".") {
		if errs := validation.IsDNS1123Subdomain(seg); len(errs) > 0 {
			return fmt.Errorf("signer name %q: path %q: %s", signer, path, strings.Join(errs, "; "))
		}
	}
	return nil
}
