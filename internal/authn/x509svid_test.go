package authn

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"net/url"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/testca"
)

var (
	localTD     = spiffeid.RequireTrustDomainFromString("example.org")
	federatedTD = spiffeid.RequireTrustDomainFromString("other.org")
	workloadID  = spiffeid.RequireFromString("spiffe://example.org/ns/default/sa/web")
)

// intermediate mints a CA signed by parent, for chains longer than a leaf.
func intermediate(t *testing.T, parent *testca.CA) *testca.CA {
	t.Helper()
	key := testca.NewKey(t, testca.ECP256)
	now := time.Now().Add(-time.Minute)
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(t),
		Subject:               pkix.Name{CommonName: "intermediate " + t.Name()},
		NotBefore:             now,
		NotAfter:              now.Add(12 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		URIs:                  []*url.URL{parent.TrustDomain.ID().URL()},
	}
	cert := testca.Sign(t, tmpl, parent.Cert, key.Public(), parent.Key)
	return &testca.CA{TrustDomain: parent.TrustDomain, Cert: cert, Key: key}
}

func TestX509SVID(t *testing.T) {
	local := testca.New(t, "example.org")
	federated := testca.New(t, "other.org")
	rogue := testca.New(t, "example.org") // same trust domain, not in our roots
	inter := intermediate(t, local)

	leaf, _ := local.Issue(t, workloadID)
	interLeaf, _ := inter.Issue(t, workloadID)
	fedLeaf, _ := federated.Issue(t, spiffeid.RequireFromString("spiffe://other.org/ns/default/sa/web"))
	fedSignedLocalID, _ := federated.Issue(t, workloadID)
	rogueLeaf, _ := rogue.Issue(t, workloadID)
	noURI, _ := local.Issue(t, workloadID, testca.Options{Mutate: func(c *x509.Certificate) {
		c.URIs = nil
		c.DNSNames = []string{"web.example.org"}
	}})
	twoURIs, _ := local.Issue(t, workloadID, testca.Options{Mutate: func(c *x509.Certificate) {
		c.URIs = append(c.URIs, spiffeid.RequireFromString("spiffe://example.org/other").URL())
	}})
	caLeaf, _ := local.Issue(t, workloadID, testca.Options{Mutate: func(c *x509.Certificate) {
		c.IsCA = true
		c.KeyUsage |= x509.KeyUsageCertSign
	}})
	serverOnly, _ := local.Issue(t, workloadID, testca.Options{Mutate: func(c *x509.Certificate) {
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}})
	noEKU, _ := local.Issue(t, workloadID, testca.Options{Mutate: func(c *x509.Certificate) {
		c.ExtKeyUsage = nil
	}})
	now := time.Now()

	roots := x509bundle.NewSet(
		x509bundle.FromX509Authorities(localTD, []*x509.Certificate{local.Cert}),
		x509bundle.FromX509Authorities(federatedTD, []*x509.Certificate{federated.Cert}),
	)

	tests := []struct {
		name    string
		certs   []*x509.Certificate
		at      time.Time
		roots   x509bundle.Source
		want    spiffeid.ID
		wantErr error
		errHas  string
	}{
		{name: "valid SVID", certs: []*x509.Certificate{leaf}, want: workloadID},
		{name: "valid SVID with intermediate", certs: []*x509.Certificate{interLeaf, inter.Cert}, want: workloadID},
		{name: "no EKU is fine", certs: []*x509.Certificate{noEKU}, want: workloadID},
		{name: "no certificate", wantErr: ErrNoCredentials},
		{name: "federated trust domain SVID", certs: []*x509.Certificate{fedLeaf}, wantErr: ErrInvalidCredentials, errHas: "not in the local trust domain"},
		{name: "local ID signed by federated root", certs: []*x509.Certificate{fedSignedLocalID}, wantErr: ErrInvalidCredentials, errHas: "could not verify"},
		{name: "chain not to local roots", certs: []*x509.Certificate{rogueLeaf}, wantErr: ErrInvalidCredentials, errHas: "could not verify"},
		{name: "intermediate missing", certs: []*x509.Certificate{interLeaf}, wantErr: ErrInvalidCredentials, errHas: "could not verify"},
		{name: "expired", certs: []*x509.Certificate{leaf}, at: leaf.NotAfter.Add(time.Second), wantErr: ErrInvalidCredentials, errHas: "expired"},
		{name: "not yet valid", certs: []*x509.Certificate{leaf}, at: leaf.NotBefore.Add(-time.Second), wantErr: ErrInvalidCredentials},
		{name: "not an SVID: no URI SAN", certs: []*x509.Certificate{noURI}, wantErr: ErrInvalidCredentials, errHas: "not an X509-SVID"},
		{name: "not an SVID: two URI SANs", certs: []*x509.Certificate{twoURIs}, wantErr: ErrInvalidCredentials, errHas: "not an X509-SVID"},
		{name: "CA certificate as leaf", certs: []*x509.Certificate{caLeaf}, wantErr: ErrInvalidCredentials, errHas: "CA flag"},
		{name: "root itself has no path", certs: []*x509.Certificate{local.Cert}, wantErr: ErrInvalidCredentials, errHas: "no path"},
		{name: "serverAuth only", certs: []*x509.Certificate{serverOnly}, wantErr: ErrInvalidCredentials, errHas: "clientAuth"},
		{name: "too many certificates", certs: []*x509.Certificate{leaf, inter.Cert, inter.Cert, inter.Cert, inter.Cert, inter.Cert, inter.Cert, inter.Cert, inter.Cert}, wantErr: ErrInvalidCredentials, errHas: "more than"},
		{name: "nil certificate", certs: []*x509.Certificate{leaf, nil}, wantErr: ErrInvalidCredentials},
		{name: "no local bundle", certs: []*x509.Certificate{leaf}, roots: x509bundle.NewSet(x509bundle.FromX509Authorities(federatedTD, []*x509.Certificate{federated.Cert, local.Cert})), wantErr: ErrInvalidCredentials, errHas: "local roots"},
		{name: "empty local bundle", certs: []*x509.Certificate{leaf}, roots: x509bundle.New(localTD), wantErr: ErrInvalidCredentials, errHas: "no X.509 roots"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at := tt.at
			if at.IsZero() {
				at = now
			}
			src := tt.roots
			if src == nil {
				src = roots
			}
			a := NewX509SVID(localTD, src, clocktesting.NewFakePassiveClock(at))
			id, err := a.Authenticate(context.Background(), Request{PeerCertificates: tt.certs})
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				assert.Contains(t, err.Error(), "authn: x509-svid: ")
				assert.Contains(t, err.Error(), tt.errHas)
				assert.Zero(t, id)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, Identity{ID: tt.want, Method: MethodX509SVID}, id)
		})
	}
}

// TestX509SVIDRootsRotated shows the roots are asked on every call: after a
// rotation that drops the old root, its SVIDs stop authenticating, and
// SVIDs of the new root start.
func TestX509SVIDRootsRotated(t *testing.T) {
	oldRoot := testca.New(t, "example.org")
	newRoot := testca.New(t, "example.org")
	oldLeaf, _ := oldRoot.Issue(t, workloadID)
	newLeaf, _ := newRoot.Issue(t, workloadID)

	roots := x509bundle.NewSet(x509bundle.FromX509Authorities(localTD, []*x509.Certificate{oldRoot.Cert}))
	a := NewX509SVID(localTD, roots, nil)
	ctx := context.Background()

	_, err := a.Authenticate(ctx, Request{PeerCertificates: []*x509.Certificate{oldLeaf}})
	require.NoError(t, err)
	_, err = a.Authenticate(ctx, Request{PeerCertificates: []*x509.Certificate{newLeaf}})
	require.ErrorIs(t, err, ErrInvalidCredentials, "new root not yet published")

	// Both published during the overlap.
	roots.Add(x509bundle.FromX509Authorities(localTD, []*x509.Certificate{oldRoot.Cert, newRoot.Cert}))
	for _, leaf := range []*x509.Certificate{oldLeaf, newLeaf} {
		_, err = a.Authenticate(ctx, Request{PeerCertificates: []*x509.Certificate{leaf}})
		require.NoError(t, err)
	}

	// Old root removed.
	roots.Add(x509bundle.FromX509Authorities(localTD, []*x509.Certificate{newRoot.Cert}))
	_, err = a.Authenticate(ctx, Request{PeerCertificates: []*x509.Certificate{oldLeaf}})
	require.ErrorIs(t, err, ErrInvalidCredentials)
	id, err := a.Authenticate(ctx, Request{PeerCertificates: []*x509.Certificate{newLeaf}})
	require.NoError(t, err)
	assert.Equal(t, workloadID, id.ID)
}

func TestX509SVIDNoTrustDomain(t *testing.T) {
	local := testca.New(t, "example.org")
	leaf, _ := local.Issue(t, workloadID)
	for name, a := range map[string]*X509SVID{
		"zero trust domain": NewX509SVID(spiffeid.TrustDomain{}, local.Bundle(), nil),
		"nil roots":         NewX509SVID(localTD, nil, nil),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := a.Authenticate(context.Background(), Request{PeerCertificates: []*x509.Certificate{leaf}})
			require.ErrorIs(t, err, ErrInvalidCredentials)
		})
	}
}
