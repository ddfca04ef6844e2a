package distribution

import (
	"bytes"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

// Keys of the distributed ConfigMap besides one "<trust-domain>.pem" per
// federated trust domain.
const (
	// KeyRootCert holds the local trust domain's X.509 roots as PEM, the
	// name Istio's istio-ca-root-cert uses.
	KeyRootCert = "root-cert.pem"
	// KeyBundleMap holds a SPIFFE bundle map of every trust domain, local
	// and federated, in the format Envoy's SPIFFE validator reads.
	KeyBundleMap = "bundle.spiffe.json"
)

// maxConfigMapBytes is the API server's limit on the summed size of a
// ConfigMap's keys and values.
const maxConfigMapBytes = 1 << 20

// Reasons a federated trust domain is left out of a rendering, the
// "reason" label of trustbridge_distribution_skipped_total.
const (
	reasonInvalidKey   = "invalid_key"
	reasonReservedKey  = "reserved_key"
	reasonUnrenderable = "unrenderable"
	reasonTooLarge     = "too_large"
)

// skip records a federated trust domain left out, whole or in part, of a
// rendering.
type skip struct {
	trustDomain string
	reason      string
	err         error
}

// errNoLocalBundle means the trust store does not (yet) hold the local
// trust domain: there is nothing to distribute.
var errNoLocalBundle = errors.New("the trust store holds no bundle for the local trust domain")

// render computes the ConfigMap data for one trust store snapshot. It is a
// pure function of its inputs and yields the same bytes for the same
// snapshot, so comparing data is enough to skip writes.
//
// A federated trust domain whose bundle cannot be marshalled is left out
// entirely (and reported), so that one broken peer cannot hold back a
// rotation of the local roots; one whose name is not a usable ConfigMap key
// only loses its .pem key. Likewise, while the data is over limit bytes the
// largest federated trust domain is left out: a peer may publish a bundle
// as large as the fetch limit allows, more than a ConfigMap holds. A
// problem with the local trust domain, or the local trust domain alone
// over the limit, fails the whole rendering and the caller keeps
// distributing the last good one.
func render(sn *trust.Snapshot, local spiffeid.TrustDomain, limit int) (map[string]string, []skip, error) {
	localBundle, ok := sn.Bundle(local)
	if !ok {
		return nil, nil, fmt.Errorf("%w (%q)", errNoLocalBundle, local.Name())
	}
	bundles := []*spiffebundle.Bundle{localBundle}
	for _, td := range sn.TrustDomains() {
		if td == local {
			continue
		}
		b, _ := sn.Bundle(td)
		bundles = append(bundles, b)
	}

	var skips []skip
	for {
		doc, err := bundledoc.MarshalMap(bundles)
		if err != nil {
			var ee *bundledoc.EntryError
			if !errors.As(err, &ee) || ee.TrustDomain == local.Name() {
				return nil, nil, fmt.Errorf("render %s: %w", KeyBundleMap, err)
			}
			i := slices.IndexFunc(bundles, func(b *spiffebundle.Bundle) bool { return b.TrustDomain().Name() == ee.TrustDomain })
			if i < 0 { // cannot happen: the entry came from this list
				return nil, nil, fmt.Errorf("render %s: %w", KeyBundleMap, err)
			}
			skips = append(skips, skip{trustDomain: ee.TrustDomain, reason: reasonUnrenderable, err: err})
			bundles = slices.Delete(bundles, i, i+1)
			continue
		}

		data, keySkips := assemble(localBundle, bundles[1:], doc)
		size := 0
		for k, v := range data {
			size += len(k) + len(v)
		}
		if size <= limit {
			return data, append(skips, keySkips...), nil
		}
		tooLarge := fmt.Errorf("rendered data is %d bytes, over the ConfigMap limit of %d", size, limit)
		if len(bundles) == 1 {
			return nil, nil, tooLarge
		}
		i := 1 + largest(bundles[1:])
		skips = append(skips, skip{trustDomain: bundles[i].TrustDomain().Name(), reason: reasonTooLarge,
			err: fmt.Errorf("%w; left out the largest federated trust domain", tooLarge)})
		bundles = slices.Delete(bundles, i, i+1)
	}
}

// assemble builds the ConfigMap data from the local bundle, the federated
// bundles and the bundle map document of all of them.
func assemble(localBundle *spiffebundle.Bundle, federated []*spiffebundle.Bundle, doc []byte) (map[string]string, []skip) {
	data := map[string]string{
		KeyRootCert:  pemRoots(localBundle),
		KeyBundleMap: string(doc),
	}
	var skips []skip
	for _, b := range federated {
		name := b.TrustDomain().Name()
		key := name + ".pem"
		if errs := validation.IsConfigMapKey(key); len(errs) > 0 {
			skips = append(skips, skip{trustDomain: name, reason: reasonInvalidKey,
				err: fmt.Errorf("key %q is not a valid ConfigMap key: %s", key, strings.Join(errs, "; "))})
			continue
		}
		if _, taken := data[key]; taken {
			skips = append(skips, skip{trustDomain: name, reason: reasonReservedKey,
				err: fmt.Errorf("key %q is reserved; the trust domain is only in %s", key, KeyBundleMap)})
			continue
		}
		data[key] = pemRoots(b)
	}
	return data, skips
}

// largest returns the index of the bundle that takes the most room in the
// rendering (its PEM and its bundle map entry), the first of equals: the
// bundles are sorted by trust domain, so the choice is deterministic.
func largest(bundles []*spiffebundle.Bundle) int {
	best, bestSize := 0, -1
	for i, b := range bundles {
		doc, _ := bundledoc.Marshal(b) // it marshalled as part of the map
		if n := len(pemRoots(b)) + len(doc); n > bestSize {
			best, bestSize = i, n
		}
	}
	return best
}

// pemRoots encodes b's X.509 authorities, in bundle order. A trust domain
// without X.509 authorities yields an empty value rather than a missing
// key: mounts that name the key keep working, and trust nothing.
func pemRoots(b *spiffebundle.Bundle) string {
	var buf bytes.Buffer
	for _, c := range b.X509Authorities() {
		_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return buf.String()
}
