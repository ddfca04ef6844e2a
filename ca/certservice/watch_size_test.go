package certservice_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/caclient"
)

// The server sends every bundle map agents accept: gRPC's send limit is
// the server's, and a smaller one failed every send of a larger map, which
// looked like a caller gone and repeated on every reconnect.
func TestWatchBundlesSendsWhatAgentsAccept(t *testing.T) {
	require.Equal(t, caclient.MaxBundleMapBytes, certservice.MaxBundleMessageSize)
	require.GreaterOrEqual(t, certservice.MaxSendMsgSize, certservice.MaxBundleMessageSize)

	// About 6 MB, over gRPC's default 4 MiB: federated trust domains
	// sharing one root padded with a large extension.
	big := paddedRoot(t, 60<<10)
	w := newWatchFixture(t, nil)
	bundles := []*spiffebundle.Bundle{w.authority.Bundle()}
	for i := range 75 {
		b := spiffebundle.New(spiffeid.RequireTrustDomainFromString(fmt.Sprintf("td%d.example", i)))
		b.AddX509Authority(big)
		bundles = append(bundles, b)
	}
	w.bundles.set(bundles...)
	got, err := caclient.FetchBundles(t.Context(), w.conn(t, w.tlsConfig(nil), goodToken), td)
	require.NoError(t, err)
	assert.Len(t, got.Bundles, 76)
	assert.Zero(t, testutil.ToFloat64(w.svc.WatchOversizedForTest()))
}

// A map over the limit is refused with a reason the caller can act on,
// logged as an error and counted, not sent to fail.
func TestWatchBundlesRefusesOversizedMessage(t *testing.T) {
	w := newWatchFixture(t, nil)
	w.svc.SetMaxWatchMessageForTest(100)
	_, err := w.watch(t, w.identityClient(t, nil, goodToken)).Recv()
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "over the 100 this server sends")
	assert.Equal(t, 1.0, testutil.ToFloat64(w.svc.WatchOversizedForTest()))
	assert.Equal(t, 1.0, testutil.ToFloat64(w.svc.WatchesForTest("ResourceExhausted", "fake-token")))
	assert.Zero(t, testutil.ToFloat64(w.svc.WatchMessagesForTest()))
	assert.Contains(t, w.logs.String(), `"level":"ERROR","msg":"bundle watch ended","reason":"message_too_large"`)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Zero(c, testutil.ToFloat64(w.svc.WatchesOpenForTest()))
	}, 10*time.Second, time.Millisecond)
}

// paddedRoot is a CA certificate carrying pad bytes in a private
// extension.
func paddedRoot(t *testing.T, pad int) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "padded"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		ExtraExtensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 99999, 1}, Value: make([]byte, pad)}},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return c
}
