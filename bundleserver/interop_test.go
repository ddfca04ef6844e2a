package bundleserver_test

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// TestInteropSPIFFEAuth fetches with go-spiffe in the https_spiffe
// profile, as a SPIRE server federating with us would: our server presents
// an X509-SVID for the endpoint's SPIFFE ID.
func TestInteropSPIFFEAuth(t *testing.T) {
	ca := testca.New(t, td.Name())
	local := ca.Bundle()
	local.SetSequenceNumber(1)
	local.SetRefreshHint(5 * time.Minute)
	src := newSource(local)
	cert := svidCert(t, ca)
	s := newServer(t, bundleserver.Config{Local: src, GetCertificate: fixedCert(cert)})
	u := serve(t, s).String()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The operator-supplied bundle for the first fetch of a self-serving
	// endpoint (Federation §5.2.2).
	trust := x509bundle.FromX509Authorities(td, []*x509.Certificate{ca.Cert})
	got, err := federation.FetchBundle(ctx, td, u, federation.WithSPIFFEAuth(trust, endpoint))
	require.NoError(t, err)
	assert.True(t, local.Equal(got), "go-spiffe sees the source's bundle")

	next := withRoot(t, local)
	src.Set(next)
	require.NoError(t, s.Update())
	got, err = federation.FetchBundle(ctx, td, u, federation.WithSPIFFEAuth(got, endpoint))
	require.NoError(t, err)
	seq, ok := got.SequenceNumber()
	require.True(t, ok)
	assert.Equal(t, uint64(2), seq)
	assert.True(t, next.Equal(got))

	// The SPIFFE ID is what authenticates the endpoint.
	_, err = federation.FetchBundle(ctx, td, u, federation.WithSPIFFEAuth(trust, spiffeid.RequireFromPath(td, "/not-the-endpoint")))
	assert.Error(t, err)
	// And only the bundle of the endpoint's trust domain vouches for it.
	other := testca.New(t, td.Name())
	_, err = federation.FetchBundle(ctx, td, u, federation.WithSPIFFEAuth(x509bundle.FromX509Authorities(td, []*x509.Certificate{other.Cert}), endpoint))
	assert.Error(t, err)
}

// TestInteropWebPKI fetches with go-spiffe in the https_web profile.
func TestInteropWebPKI(t *testing.T) {
	web := testca.New(t, "webpki.test")
	local := newBundle(t, td, 2, 41, time.Minute)
	s := newServer(t, bundleserver.Config{Local: newSource(local), Path: "/.well-known/spiffe-bundle",
		GetCertificate: fixedCert(webCert(t, web))})
	u := serve(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for _, host := range []string{u.Host, "localhost:" + u.Port()} {
		got, err := federation.FetchBundle(ctx, td, "https://"+host+"/.well-known/spiffe-bundle", federation.WithWebPKIRoots(pool(web.Cert)))
		require.NoError(t, err, host)
		assert.True(t, local.Equal(got), host)
	}
	_, err := federation.FetchBundle(ctx, td, u.String()+".well-known/spiffe-bundle", federation.WithWebPKIRoots(pool(testca.New(t, "other.test").Cert)))
	assert.Error(t, err, "an untrusted server certificate")
}
