package certservice_test

import (
	"crypto/tls"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
)

func TestTLSConfig(t *testing.T) {
	getCert := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return nil, errors.New("unused") }
	cfg := certservice.TLSConfig(getCert)
	assert.Equal(t, uint16(tls.VersionTLS12), cfg.MinVersion)
	assert.Equal(t, tls.RequestClientCert, cfg.ClientAuth, "a client certificate is optional and verified per call")
	assert.True(t, cfg.SessionTicketsDisabled)
	assert.NotNil(t, cfg.GetCertificate)
	assert.Nil(t, cfg.Certificates)
}

// switchableRoots is a roots source whose answer a test changes.
type switchableRoots struct {
	b atomic.Pointer[x509bundle.Bundle]
}

func (s *switchableRoots) GetX509BundleForTrustDomain(spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	return s.b.Load(), nil
}

// A root removed from the local bundle stops authenticating its SVIDs on
// the next call, on the same connection: verification is per call, not
// per handshake.
func TestRemovedRootRefusedOnLiveConnection(t *testing.T) {
	roots := &switchableRoots{}
	f := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		roots.b.Store(a.Bundle().X509Bundle())
		cfg.Authenticator = authn.NewX509SVID(td, roots, nil)
	})
	c := f.client(t, svid(t, f.authority, workloadID), "")
	req := &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t)}
	_, err := c.CreateCertificate(t.Context(), req)
	require.NoError(t, err)

	other := newAuthority(t, td) // another CA of the trust domain replaces ours
	roots.b.Store(other.Bundle().X509Bundle())
	_, err = c.CreateCertificate(t.Context(), req)
	assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)

	roots.b.Store(f.authority.Bundle().X509Bundle())
	_, err = c.CreateCertificate(t.Context(), req)
	assert.NoError(t, err, "back once the root is")
}

func TestOldTLSVersionsRefused(t *testing.T) {
	f := newFixture(t, nil)
	cfg := f.tlsConfig(svid(t, f.authority, workloadID))
	cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
	c := f.clientTLS(t, cfg, "")
	_, err := c.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: freshCSR(t)})
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Zero(t, f.signer.calls.Load())
}
