package certservice_test

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
)

// FuzzCreateCertificate drives the handler with arbitrary CSR bytes and
// lifetimes for a caller proven as workloadID. Whatever the input, the
// answer is a certificate for workloadID and nothing else, or a refusal
// with one of the request-level codes.
func FuzzCreateCertificate(f *testing.F) {
	key, err := ca.GenerateKey(ca.KeyECP256)
	if err != nil {
		f.Fatal(err)
	}
	good := newCSR(f, key)
	f.Add([]byte(good), int64(0))
	f.Add([]byte(good), int64(3600))
	f.Add([]byte(good), int64(-1))
	f.Add([]byte(good), int64(1<<62))
	f.Add([]byte(newCSR(f, key, workloadID.String())), int64(60))
	f.Add([]byte(newCSR(f, key, "spiffe://example.org/other")), int64(60))
	f.Add([]byte(newCSR(f, key, "spiffe://other.example/ns/default/sa/web")), int64(60))
	f.Add([]byte(newCSR(f, key, workloadID.String(), workloadID.String())), int64(60))
	f.Add([]byte(good+good), int64(0))
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\n-----END CERTIFICATE REQUEST-----\n"), int64(0))
	f.Add([]byte{0x30, 0x03, 0x02, 0x01, 0x00}, int64(0))
	f.Add([]byte{}, int64(0))

	a := newAuthority(f, td)
	svc, err := certservice.New(certservice.Config{
		Signer: a,
		Authenticator: authn.AuthenticatorFunc(func(context.Context, authn.Request) (authn.Identity, error) {
			return authn.Identity{ID: workloadID, Method: "fuzz"}, nil
		}),
	})
	if err != nil {
		f.Fatal(err)
	}
	roots := a.Bundle().X509Bundle()
	f.Fuzz(func(t *testing.T, csr []byte, validity int64) {
		resp, err := svc.CreateCertificate(context.Background(), &securityv1alpha1.IstioCertificateRequest{Csr: string(csr), ValidityDuration: validity})
		if err != nil {
			switch status.Code(err) {
			case codes.InvalidArgument, codes.PermissionDenied:
			default:
				t.Fatalf("unexpected refusal %v", err)
			}
			if resp != nil {
				t.Fatal("a response with an error")
			}
			return
		}
		chain := make([]*x509.Certificate, 0, len(resp.CertChain))
		for _, p := range resp.CertChain {
			chain = append(chain, mustParsePEMCert(t, p))
		}
		id, _, err := x509svid.Verify(chain[:1], roots)
		if err != nil {
			t.Fatalf("issued leaf does not verify: %v", err)
		}
		if id != workloadID {
			t.Fatalf("issued %s, proven %s", id, workloadID)
		}
		if validity < 0 || validity > int64(ca.DefaultConfig().MaxWorkloadTTL/time.Second) {
			t.Fatalf("validity %d accepted", validity)
		}
	})
}

func mustParsePEMCert(t *testing.T, p string) *x509.Certificate {
	t.Helper()
	chain := parseChain(t, []string{p})
	return chain[0]
}
