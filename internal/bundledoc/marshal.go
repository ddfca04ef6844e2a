package bundledoc

import (
	"bytes"
	"cmp"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
)

// Marshal renders b as a SPIFFE bundle document. The same bundle always
// yields the same bytes: X.509 authorities in bundle order, then JWT and WIT
// authorities sorted by key ID, each with "use" set, x509 entries with
// exactly one x5c certificate and no kid. Sequence and refresh hint are
// written when set. It refuses an authority that Parse would refuse, so
// trustbridge never publishes a bundle it would itself reject. (RSA keys
// over 4096 bits are valid but go-spiffe refuses them; Parse warns.)
func Marshal(b *spiffebundle.Bundle) ([]byte, error) {
	if b == nil {
		return nil, wrap(errors.New("nil bundle"))
	}
	var buf bytes.Buffer
	if err := writeBundle(&buf, b, true); err != nil {
		return nil, wrap(err)
	}
	return buf.Bytes(), nil
}

func writeBundle(buf *bytes.Buffer, b *spiffebundle.Bundle, withHint bool) error {
	buf.WriteString(`{"keys":[`)
	emit := keyWriter(buf)
	for _, cert := range b.X509Authorities() {
		if err := checkCA(cert); err != nil {
			return fmt.Errorf("keys[%d]: %w", emit.n, err)
		}
		if err := checkKey(cert.PublicKey); err != nil {
			return fmt.Errorf("keys[%d]: %w", emit.n, err)
		}
		if err := emit.write(jose.JSONWebKey{Key: cert.PublicKey, Use: UseX509SVID, Certificates: []*x509.Certificate{cert}}); err != nil {
			return err
		}
	}
	if err := writeKeysByID(emit, UseJWTSVID, b.JWTAuthorities()); err != nil {
		return err
	}
	if err := writeKeysByID(emit, UseWITSVID, b.WITAuthorities()); err != nil {
		return err
	}
	buf.WriteByte(']')
	if seq, ok := b.SequenceNumber(); ok {
		buf.WriteString(`,"spiffe_sequence":`)
		buf.WriteString(strconv.FormatUint(seq, 10))
	}
	if hint, ok := b.RefreshHint(); ok && withHint {
		if hint < 0 {
			return fmt.Errorf("negative refresh hint %s", hint)
		}
		// Round up like go-spiffe: a hint of 1.5s must not become 1s.
		secs := (hint + time.Second - 1) / time.Second
		buf.WriteString(`,"spiffe_refresh_hint":`)
		buf.WriteString(strconv.FormatInt(int64(secs), 10))
	}
	buf.WriteByte('}')
	return nil
}

// keys writes JSON web keys comma-separated into buf, counting them.
type keys struct {
	buf *bytes.Buffer
	n   int
}

func keyWriter(buf *bytes.Buffer) *keys { return &keys{buf: buf} }

func (w *keys) write(k jose.JSONWebKey) error {
	data, err := k.MarshalJSON()
	if err != nil {
		return fmt.Errorf("keys[%d]: %w", w.n, err)
	}
	if w.n > 0 {
		w.buf.WriteByte(',')
	}
	w.buf.Write(data)
	w.n++
	return nil
}

// writeKeysByID writes keys sorted by key ID, each with "use" set to use
// unless it is empty.
func writeKeysByID(w *keys, use string, keys map[string]crypto.PublicKey) error {
	kids := make([]string, 0, len(keys))
	for kid := range keys {
		kids = append(kids, kid)
	}
	sort.Strings(kids)
	for _, kid := range kids {
		if err := checkKey(keys[kid]); err != nil {
			return fmt.Errorf("keys[%d] (%s kid %q): %w", w.n, cmp.Or(use, "JWKS"), kid, err)
		}
		if err := w.write(jose.JSONWebKey{Key: keys[kid], KeyID: kid, Use: use}); err != nil {
			return err
		}
	}
	return nil
}

// MarshalJWKS renders keys as a standard JWKS document (RFC 7517, no
// SPIFFE parameters, as the Workload API's JWT bundles are): the same keys
// always yield the same bytes, sorted by key ID, where go-spiffe's
// jwtbundle.Bundle.Marshal follows map order. It refuses a key Parse
// would refuse.
func MarshalJWKS(keys map[string]crypto.PublicKey) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString(`{"keys":[`)
	if err := writeKeysByID(keyWriter(&buf), "", keys); err != nil {
		return nil, wrap(err)
	}
	buf.WriteString("]}")
	return buf.Bytes(), nil
}

// MarshalMap renders bundles as a SPIFFE bundle map, trust domains sorted by
// name. Refresh hints are omitted, as the spec asks of producers.
func MarshalMap(bundles []*spiffebundle.Bundle) ([]byte, error) {
	sorted := make([]*spiffebundle.Bundle, 0, len(bundles))
	seen := map[string]bool{}
	for _, b := range bundles {
		if b == nil {
			return nil, wrap(errors.New("nil bundle in map"))
		}
		name := b.TrustDomain().Name()
		if name == "" {
			return nil, wrap(errors.New("bundle without a trust domain in map"))
		}
		if seen[name] {
			return nil, wrap(fmt.Errorf("duplicate trust domain %q in map", name))
		}
		seen[name] = true
		sorted = append(sorted, b)
	}
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].TrustDomain().Name() < sorted[j].TrustDomain().Name() })

	var buf bytes.Buffer
	buf.WriteString(`{"trust_domains":{`)
	for i, b := range sorted {
		if i > 0 {
			buf.WriteByte(',')
		}
		name, _ := json.Marshal(b.TrustDomain().Name())
		buf.Write(name)
		buf.WriteByte(':')
		if err := writeBundle(&buf, b, false); err != nil {
			return nil, wrap(&EntryError{TrustDomain: b.TrustDomain().Name(), Err: err})
		}
	}
	buf.WriteString("}}")
	return buf.Bytes(), nil
}
