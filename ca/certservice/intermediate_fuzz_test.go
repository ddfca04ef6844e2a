package certservice

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// FuzzIntermediateRequest drives the parsing of SignIntermediate requests
// with arbitrary wire bytes: whatever parses is either refused with
// InvalidArgument, or yields a CSR whose signature checks and a lifetime
// in (0, MaxDownstreamTTL].
func FuzzIntermediateRequest(f *testing.F) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(f, err)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	require.NoError(f, err)
	for _, req := range []*identityapi.SignIntermediateRequest{
		{},
		{Csr: csr},
		{Csr: csr, TtlSeconds: 3600},
		{Csr: csr, TtlSeconds: -1},
		{Csr: csr, TtlSeconds: 1 << 62},
		{Csr: csr[:len(csr)-1]},
		{Csr: []byte("-----BEGIN CERTIFICATE REQUEST-----\n")},
	} {
		b, err := proto.Marshal(req)
		require.NoError(f, err)
		f.Add(b)
	}
	s := &Service{cfg: Config{MaxDownstreamTTL: 48 * time.Hour}}
	f.Fuzz(func(t *testing.T, wire []byte) {
		var req identityapi.SignIntermediateRequest
		if proto.Unmarshal(wire, &req) != nil {
			return
		}
		got, ttl, ref := s.parseIntermediateRequest(&req)
		if ref != nil {
			assert.Equal(t, codes.InvalidArgument, ref.code)
			assert.NotEmpty(t, ref.msg)
			return
		}
		require.NotNil(t, got)
		require.NoError(t, got.CheckSignature())
		assert.Greater(t, ttl, time.Duration(0))
		assert.LessOrEqual(t, ttl, 48*time.Hour)
	})
}
