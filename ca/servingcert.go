package ca

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/logattr"
)

// renewRetry is how soon a failed renewal is tried again.
const renewRetry = 10 * time.Second

// ServingCert keeps an X509-SVID for one of trustbridge's own identities
// (the https_spiffe bundle endpoint, later the gRPC listener), signed by
// this CA and renewed at half its lifetime, for tls.Config.GetCertificate:
// rotation never needs a restart.
type ServingCert struct {
	a   *Authority
	id  spiffeid.ID
	ttl time.Duration
	cur atomic.Pointer[tls.Certificate]
}

// ServingCert issues a first certificate for id, with a fresh key that
// never leaves the process.
func (a *Authority) ServingCert(id spiffeid.ID, ttl time.Duration) (*ServingCert, error) {
	s := &ServingCert{a: a, id: id, ttl: ttl}
	if err := s.Renew(); err != nil {
		return nil, err
	}
	return s, nil
}

// GetCertificate serves the current certificate.
func (s *ServingCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.cur.Load(), nil
}

// Leaf is the current certificate.
func (s *ServingCert) Leaf() *x509.Certificate { return s.cur.Load().Leaf }

// Renew issues a new certificate now.
func (s *ServingCert) Renew() error {
	key, err := GenerateKey(KeyECP256)
	if err != nil {
		return err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{s.id.URL()}}, key)
	if err != nil {
		return fmt.Errorf("ca: serving certificate for %s: %w", s.id, err)
	}
	csr, err := ParseCSR(der)
	if err != nil {
		return err
	}
	issued, err := s.a.Sign(csr, s.id, s.ttl)
	if err != nil {
		return fmt.Errorf("ca: serving certificate for %s: %w", s.id, err)
	}
	cert := &tls.Certificate{PrivateKey: key, Leaf: issued.Leaf}
	for _, c := range issued.Chain {
		if isRoot(c, issued.Roots) {
			continue // peers bring their own roots
		}
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	s.cur.Store(cert)
	s.a.cfg.Logger.Info("serving certificate issued", logattr.SPIFFEID, s.id.String(),
		"not_after", issued.Leaf.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// NextRenewal is half way through the current certificate's life.
func (s *ServingCert) NextRenewal() time.Time {
	l := s.Leaf()
	return l.NotBefore.Add(l.NotAfter.Sub(l.NotBefore) / 2)
}

// Run renews the certificate at half its lifetime until ctx is done. A
// failed renewal is retried every few seconds; the current certificate is
// served meanwhile.
func (s *ServingCert) Run(ctx context.Context) error {
	clk := s.a.cfg.Clock
	next := s.NextRenewal()
	for {
		t := clk.NewTimer(next.Sub(clk.Now()))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
		if err := s.Renew(); err != nil {
			s.a.cfg.Logger.Error("serving certificate renewal failed; retrying", logattr.SPIFFEID, s.id.String(), logattr.Error, err)
			next = clk.Now().Add(renewRetry)
			continue
		}
		next = s.NextRenewal()
	}
}
