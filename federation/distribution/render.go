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
// only loses its .pem key. A problem with the local trust domain, or data
// over limit bytes, fails the whole rendering and the caller keeps
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
	var doc []byte
	for {
		var err error
		doc, err = bundledoc.MarshalMap(bundles)
		if err == nil {
			break
		}
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
	}

	data := map[string]string{
		KeyRootCert:  pemRoots(localBundle),
		KeyBundleMap: string(doc),
	}
	for _, b := range bundles[1:] {
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

	size := 0
	for k, v := range data {
		size += len(k) + len(v)
	}
	if size > limit {
		return nil, nil, fmt.Errorf("rendered data is %d bytes, over the ConfigMap limit of %d", size, limit)
	}
	return data, skips, nil
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
