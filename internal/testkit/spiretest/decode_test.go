package spiretest

import (
	"crypto/x509"
	"encoding/pem"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func inline(b []byte) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
}

func response(t *testing.T, secrets ...*tlsv3.Secret) *discoveryv3.DiscoveryResponse {
	t.Helper()
	resp := &discoveryv3.DiscoveryResponse{TypeUrl: "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"}
	for _, s := range secrets {
		a, err := anypb.New(s)
		require.NoError(t, err)
		resp.Resources = append(resp.Resources, a)
	}
	return resp
}

// TestDecodeSDS covers the shapes SPIRE does not serve but another SDS
// server might: trusted_ca, extra fields, a key that is not the leaf's,
// a file data source.
func TestDecodeSDS(t *testing.T) {
	a, b := testca.New(t, "a.test"), testca.New(t, "b.test")
	id := spiffeid.RequireFromString("spiffe://a.test/w")
	leaf, key := a.Issue(t, id)
	_, otherKey := a.Issue(t, id)
	keyPEM := func(k any) []byte {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		require.NoError(t, err)
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	}
	validator, err := anypb.New(&tlsv3.SPIFFECertValidatorConfig{TrustDomains: []*tlsv3.SPIFFECertValidatorConfig_TrustDomain{
		{Name: "b.test", TrustBundle: inline(testca.PEM(b.Cert))},
		{Name: "a.test", TrustBundle: inline(testca.PEM(a.Cert))},
	}, TrustBundles: inline([]byte("{}"))})
	require.NoError(t, err)

	got, err := DecodeSDS(response(t,
		&tlsv3.Secret{Name: "default", Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inline(testca.PEM(leaf, a.Cert)), PrivateKey: inline(keyPEM(key)),
		}}},
		&tlsv3.Secret{Name: "mismatch", Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inline(testca.PEM(leaf)), PrivateKey: inline(keyPEM(otherKey)),
		}}},
		&tlsv3.Secret{Name: "plain", Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: inline(testca.PEM(a.Cert, b.Cert)), OnlyVerifyLeafCertCrl: true,
		}}},
		&tlsv3.Secret{Name: "ROOTCA", Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			CustomValidatorConfig: &corev3.TypedExtensionConfig{Name: SPIFFEValidatorName, TypedConfig: validator},
		}}},
	))
	require.NoError(t, err)
	assert.Equal(t, []string{"default", "mismatch", "plain", "ROOTCA"}, got.Names())
	assert.Equal(t, &TLSCertificate{URISANs: []string{id.String()}, ChainLength: 2, KeyMatchesLeaf: true, ChainSource: "inline_bytes", KeySource: "inline_bytes"},
		got.Secret("default").TLSCertificate)
	assert.False(t, got.Secret("mismatch").TLSCertificate.KeyMatchesLeaf)
	assert.Equal(t, &ValidationContext{TrustedCA: []string{RootSHA256(a.Cert), RootSHA256(b.Cert)}, OtherFields: []string{"only_verify_leaf_cert_crl"}},
		got.Secret("plain").ValidationContext)
	assert.Equal(t, &ValidationContext{
		Validator: SPIFFEValidatorName, ValidatorType: validator.GetTypeUrl(),
		TrustDomains: []TrustDomainRoots{
			{Name: "b.test", Source: "inline_bytes", Roots: []string{RootSHA256(b.Cert)}},
			{Name: "a.test", Source: "inline_bytes", Roots: []string{RootSHA256(a.Cert)}},
		},
		OtherFields: []string{"custom_validator_config.trust_bundles"},
	}, got.Secret("ROOTCA").ValidationContext)
	assert.True(t, proto.Equal(got.Raw["ROOTCA"], &tlsv3.Secret{Name: "ROOTCA", Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		CustomValidatorConfig: &corev3.TypedExtensionConfig{Name: SPIFFEValidatorName, TypedConfig: validator},
	}}}))
	assert.Nil(t, got.Secret("ALL"))

	_, err = DecodeSDS(response(t, &tlsv3.Secret{Name: "file", Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: "/etc/cert.pem"}},
	}}}))
	assert.ErrorContains(t, err, `sds secret "file": certificate_chain: filename data source not read`)
}
