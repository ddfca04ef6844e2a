package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/sds"
)

// storeTrust publishes the trust store to SDS: the cell holds the store's
// current snapshot from the start, and run republishes it after every
// change, so a federation update or a CA rotation reaches every SDS stream
// as soon as the store has it.
type storeTrust struct {
	store *trust.Store
	cell  *sds.TrustCell
	// changes is subscribed at construction, so no change between setup
	// and run is missed.
	changes <-chan struct{}
	cancel  func()
}

func newStoreTrust(store *trust.Store) (*storeTrust, error) {
	changes, cancel := store.Subscribe()
	st := &storeTrust{store: store, cell: sds.NewTrustCell(), changes: changes, cancel: cancel}
	if err := st.publish(); err != nil {
		cancel()
		return nil, err
	}
	return st, nil
}

// publish copies the store's current snapshot into the cell.
func (st *storeTrust) publish() error {
	snap := st.store.Snapshot()
	tds := snap.TrustDomains()
	bundles := make([]*x509bundle.Bundle, 0, len(tds))
	for _, td := range tds {
		if b, ok := snap.X509BundleFor(td); ok && len(b.X509Authorities()) > 0 {
			bundles = append(bundles, b)
		}
	}
	return st.cell.Set(bundles)
}

// run republishes after each change until ctx is done. The store keeps
// one bundle per trust domain, so Set cannot refuse what it publishes; if
// it ever did, the previous trust stays and the error ends the server
// rather than leaving SDS silently behind.
func (st *storeTrust) run(ctx context.Context) error {
	defer st.cancel()
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-st.changes:
			if !ok {
				return nil
			}
			if err := st.publish(); err != nil {
				return fmt.Errorf("sds: publishing the trust store: %w", err)
			}
		}
	}
}

// authoritySigner signs the CSRs sds.Minter makes for callers SDS has
// authenticated; the chain handed to Envoy leaves the roots out, which
// the validation contexts carry.
type authoritySigner struct{ a *ca.Authority }

func (s authoritySigner) Sign(csr *x509.CertificateRequest, id spiffeid.ID, ttl time.Duration) ([]*x509.Certificate, error) {
	// Authority.Sign wants a CSR whose signature ParseCSR checked.
	parsed, err := ca.ParseCSR(csr.Raw)
	if err != nil {
		return nil, err
	}
	// Marked, so that the certificate never authenticates to this server
	// (authn.GrantMethodSDS).
	marker, err := authn.Grant{Method: authn.GrantMethodSDS, GrantedAt: time.Now()}.Extension()
	if err != nil {
		return nil, err
	}
	issued, err := s.a.Sign(parsed, id, ttl, marker)
	if err != nil {
		return nil, err
	}
	n := max(len(issued.Chain)-len(issued.Roots), 0)
	return issued.Chain[:n], nil
}

// effectiveWorkloadTTL is the lifetime the CA gives a workload that does not
// ask for one: --workload-ttl, else 24h capped by --max-workload-ttl.
func effectiveWorkloadTTL(workloadTTL, maxTTL time.Duration) time.Duration {
	if workloadTTL > 0 {
		return workloadTTL
	}
	if maxTTL > 0 && maxTTL < ca.DefaultWorkloadTTL {
		return maxTTL
	}
	return ca.DefaultWorkloadTTL
}
