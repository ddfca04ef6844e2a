package sds

import (
	"context"
	"crypto"
	"crypto/x509"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// IdentityCredentialSource is a CredentialSource whose credential depends
// on how the caller proved its identity, not on its SPIFFE ID alone. The
// server asks CredentialFor instead of Credential when its source
// implements it. *Minter does: only a Kubernetes grant gets a workload
// DNS name.
type IdentityCredentialSource interface {
	CredentialFor(ctx context.Context, ident authn.Identity) (*Credential, error)
}

// DNSSigner is a Signer that also puts DNS SANs the server decided beside
// the SPIFFE ID (MinterConfig.WorkloadDNSNames).
type DNSSigner interface {
	SignWithDNSNames(pub crypto.PublicKey, id spiffeid.ID, ttl time.Duration, dnsNames []string) ([]*x509.Certificate, error)
}

// mintNames are the DNS names of a certificate to mint, or why a
// Kubernetes identity gets none.
type mintNames struct {
	names   []string
	skipped error
	grant   string // method, for the log
}

// Results of trustbridge_sds_workload_dns_names_total.
const (
	dnsNamesAdded   = "added"
	dnsNamesSkipped = "skipped"
)

func (m *Minter) initDNSNames() error {
	if m.cfg.WorkloadDNSNames == nil {
		return nil
	}
	if _, ok := m.cfg.Signer.(DNSSigner); !ok {
		return fmt.Errorf("sds: minter: workload DNS names need a signer that adds DNS names (%T is no DNSSigner)", m.cfg.Signer)
	}
	m.dnsNames = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustbridge_sds_workload_dns_names_total",
		Help: "Certificates SDS minted for Kubernetes identities under --workload-dns-name-template, by result (added: with the workload DNS name; skipped: SPIFFE ID only, the reason is logged).",
	}, []string{"result"})
	if m.cfg.Registerer != nil {
		if err := m.cfg.Registerer.Register(m.dnsNames); err != nil {
			return fmt.Errorf("sds: minter: %w", err)
		}
	}
	return nil
}

// CredentialFor is Credential for ident.ID, with the DNS name
// WorkloadDNSNames gives ident's grant: the token's own for a token
// caller, the one its certificate records for an X509-SVID caller. The
// credentials of one SPIFFE ID with and without a name are cached apart.
func (m *Minter) CredentialFor(ctx context.Context, ident authn.Identity) (*Credential, error) {
	var names mintNames
	if m.cfg.WorkloadDNSNames != nil && ident.Grant != nil {
		names.grant = ident.Grant.Method
		names.names, names.skipped = m.cfg.WorkloadDNSNames.Names(ident.ID, *ident.Grant)
	}
	return m.credential(ctx, mintKey{id: ident.ID, dnsNames: strings.Join(names.names, ",")}, names)
}

// sign has the certificate signed, with names when there are any, and
// counts and logs the decision once per certificate.
func (m *Minter) sign(pub crypto.PublicKey, id spiffeid.ID, names mintNames) ([]*x509.Certificate, error) {
	switch {
	case names.skipped != nil:
		m.dnsNames.WithLabelValues(dnsNamesSkipped).Inc()
		m.cfg.Logger.Warn("SDS certificate minted without a workload DNS name (--workload-dns-name-template)",
			logattr.SPIFFEID, id.String(), logattr.GrantMethod, names.grant, "reason", names.skipped.Error())
	case len(names.names) > 0:
		m.dnsNames.WithLabelValues(dnsNamesAdded).Inc()
		return m.cfg.Signer.(DNSSigner).SignWithDNSNames(pub, id, m.cfg.TTL, names.names)
	}
	return m.cfg.Signer.Sign(pub, id, m.cfg.TTL)
}
