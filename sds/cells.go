package sds

import (
	"cmp"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// TrustCell is a TrustSource whose Trust is replaced with Set: the latest
// value plus a channel closed on replacement.
type TrustCell struct {
	mu      sync.Mutex
	cur     *Trust
	changed chan struct{} // cur.Changed
}

// NewTrustCell returns a cell holding an empty Trust.
func NewTrustCell() *TrustCell {
	ch := make(chan struct{})
	return &TrustCell{cur: &Trust{Changed: ch}, changed: ch}
}

// Set publishes bundles (any order; sorted and copied; error on nil or two
// bundles of one trust domain, and then the previous Trust stays) and
// closes the previous Trust's Changed.
func (c *TrustCell) Set(bundles []*x509bundle.Bundle) error {
	out := make([]*x509bundle.Bundle, 0, len(bundles))
	for i, b := range bundles {
		if b == nil {
			return fmt.Errorf("sds: bundle %d is nil", i)
		}
		out = append(out, b.Clone())
	}
	slices.SortFunc(out, func(a, b *x509bundle.Bundle) int {
		return cmp.Compare(a.TrustDomain().Name(), b.TrustDomain().Name())
	})
	for i := 1; i < len(out); i++ {
		if out[i].TrustDomain() == out[i-1].TrustDomain() {
			return fmt.Errorf("sds: two bundles for trust domain %q", out[i].TrustDomain().Name())
		}
	}
	ch := make(chan struct{})
	c.mu.Lock()
	defer c.mu.Unlock()
	prev := c.changed
	c.cur = &Trust{Bundles: out, Changed: ch}
	c.changed = ch
	close(prev)
	return nil
}

// Trust returns the current Trust: before the first Set, one with no
// bundles whose Changed is closed by the first Set.
func (c *TrustCell) Trust() *Trust {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// CredentialCell is a CredentialSource for one identity (the node agent's
// workload): the latest credential plus a channel closed on replacement.
type CredentialCell struct {
	id      spiffeid.ID
	mu      sync.Mutex
	cur     *Credential // nil before the first Set
	changed chan struct{}
}

// NewCredentialCell returns an empty cell for id.
func NewCredentialCell(id spiffeid.ID) *CredentialCell {
	return &CredentialCell{id: id}
}

// Set checks the leaf is an X509-SVID for the cell's identity whose public
// key matches key, then publishes it and closes the previous Credential's
// Changed. On error the previous credential stays.
func (c *CredentialCell) Set(chain []*x509.Certificate, key crypto.Signer) error {
	if err := checkCredential(chain, key, c.id); err != nil {
		return fmt.Errorf("sds: %w", err)
	}
	ch := make(chan struct{})
	cred := &Credential{Chain: slices.Clone(chain), Key: key, Changed: ch}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.changed != nil {
		close(c.changed)
	}
	c.cur, c.changed = cred, ch
	return nil
}

// Credential returns the current credential: ErrNoCredential before the
// first Set, and an error for any id but the cell's own.
func (c *CredentialCell) Credential(_ context.Context, id spiffeid.ID) (*Credential, error) {
	if id != c.id {
		return nil, fmt.Errorf("sds: credential cell holds %s, not %s", c.id, id)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil {
		return nil, ErrNoCredential
	}
	return c.cur, nil
}

// publicKeyEqual is implemented by every public key type of crypto/*.
type publicKeyEqual interface {
	Equal(crypto.PublicKey) bool
}

// checkCredential checks that chain[0] is an X509-SVID leaf for id and is
// the certificate of key.
func checkCredential(chain []*x509.Certificate, key crypto.Signer, id spiffeid.ID) error {
	if len(chain) == 0 || chain[0] == nil {
		return errors.New("empty certificate chain")
	}
	if slices.Contains(chain, nil) {
		return errors.New("nil certificate in chain")
	}
	if key == nil {
		return errors.New("no private key")
	}
	leaf := chain[0]
	got, err := x509svid.IDFromCert(leaf)
	if err != nil {
		return fmt.Errorf("leaf is not an X509-SVID: %w", err)
	}
	if got != id {
		return fmt.Errorf("leaf is for %s, not %s", got, id)
	}
	if leaf.IsCA {
		return fmt.Errorf("leaf for %s is a CA certificate", id)
	}
	pub, ok := leaf.PublicKey.(publicKeyEqual)
	if !ok || !pub.Equal(key.Public()) {
		return fmt.Errorf("private key does not match the leaf for %s", id)
	}
	return nil
}
