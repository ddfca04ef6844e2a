package server

import (
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/sds"
)

// storeTrust is the trust store as SDS's TrustSource: the current
// snapshot's X.509 bundles, with the snapshot's Superseded channel as
// Changed, so every SDS stream follows the store itself and a federation
// update or a CA rotation reaches it as soon as the store has it, with no
// copy in between.
type storeTrust struct {
	store *trust.Store
	last  atomic.Pointer[storeTrustView]
}

// storeTrustView is the Trust of one snapshot, made once.
type storeTrustView struct {
	snap  *trust.Snapshot
	trust *sds.Trust
}

// Trust implements sds.TrustSource.
func (s *storeTrust) Trust() *sds.Trust {
	snap := s.store.Snapshot()
	if v := s.last.Load(); v != nil && v.snap == snap {
		return v.trust
	}
	v := &storeTrustView{snap: snap, trust: &sds.Trust{Bundles: snap.X509Bundles(), Changed: snap.Superseded()}}
	s.last.Store(v)
	return v.trust
}

// authoritySigner signs the keys sds.Minter makes for callers SDS has
// authenticated; the chain handed to Envoy leaves the roots out, which
// the validation contexts carry.
type authoritySigner struct{ a *ca.Authority }

func (s authoritySigner) Sign(pub crypto.PublicKey, id spiffeid.ID, ttl time.Duration) ([]*x509.Certificate, error) {
	return s.SignWithDNSNames(pub, id, ttl, nil)
}

// SignWithDNSNames implements sds.DNSSigner: the workload DNS names the
// minter decided from the caller's grant (--workload-dns-name-template).
func (s authoritySigner) SignWithDNSNames(pub crypto.PublicKey, id spiffeid.ID, ttl time.Duration, dnsNames []string) ([]*x509.Certificate, error) {
	// Marked, so that the certificate never authenticates to this server
	// (authn.GrantMethodSDS).
	marker, err := authn.Grant{Method: authn.GrantMethodSDS, GrantedAt: time.Now()}.Extension()
	if err != nil {
		return nil, err
	}
	issued, err := s.a.SignX509SVID(ca.X509SVIDParams{PublicKey: pub, SPIFFEID: id, TTL: ttl, DNSNames: dnsNames, Extensions: []pkix.Extension{marker}})
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
	if maxTTL > 0 && maxTTL < ca.DefaultConfig().WorkloadTTL {
		return maxTTL
	}
	return ca.DefaultConfig().WorkloadTTL
}
