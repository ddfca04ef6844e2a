package catest

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// RPC is one RPC of the certificate listener as a grant test calls it: a
// call with a well-formed request, so that only authentication can refuse
// it (a stream's first message stands for its answer), and the code it
// refuses a caller whose grant no longer stands with.
type RPC struct {
	Call    func(t *testing.T, conn *grpc.ClientConn) error
	Refused codes.Code
}

// CertServiceRPCs has a row for every RPC ca/certservice registers, keyed
// by full method name; csr makes a PEM certificate request and
// intermediateCSR a DER one for the trust domain's ID. A renewal is
// refused with PermissionDenied and its reason; the identity service's
// calls do not authenticate such a caller (Unauthenticated).
func CertServiceRPCs(csr func(testing.TB) string, intermediateCSR func(testing.TB) []byte) map[string]RPC {
	return map[string]RPC{
		securityv1alpha1.IstioCertificateService_CreateCertificate_FullMethodName: {Refused: codes.PermissionDenied,
			Call: func(t *testing.T, conn *grpc.ClientConn) error {
				_, err := securityv1alpha1.NewIstioCertificateServiceClient(conn).CreateCertificate(t.Context(),
					&securityv1alpha1.IstioCertificateRequest{Csr: csr(t), ValidityDuration: 600})
				return err
			}},
		identityapi.IdentityService_MintJWTSVID_FullMethodName: {Refused: codes.Unauthenticated,
			Call: func(t *testing.T, conn *grpc.ClientConn) error {
				_, err := identityapi.NewIdentityServiceClient(conn).MintJWTSVID(t.Context(), &identityapi.MintJWTSVIDRequest{Audience: []string{"a"}})
				return err
			}},
		identityapi.IdentityService_MintJWTSVIDs_FullMethodName: {Refused: codes.Unauthenticated,
			Call: func(t *testing.T, conn *grpc.ClientConn) error {
				_, err := identityapi.NewIdentityServiceClient(conn).MintJWTSVIDs(t.Context(), &identityapi.MintJWTSVIDsRequest{
					Requests: []*identityapi.MintJWTSVIDRequest{{Audience: []string{"a"}}}})
				return err
			}},
		identityapi.IdentityService_WatchBundles_FullMethodName: {Refused: codes.Unauthenticated,
			Call: func(t *testing.T, conn *grpc.ClientConn) error {
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				stream, err := identityapi.NewIdentityServiceClient(conn).WatchBundles(ctx, &identityapi.WatchBundlesRequest{})
				if err != nil {
					return err
				}
				_, err = stream.Recv()
				return err
			}},
		identityapi.IdentityService_SignIntermediate_FullMethodName: {Refused: codes.Unauthenticated,
			Call: func(t *testing.T, conn *grpc.ClientConn) error {
				_, err := identityapi.NewIdentityServiceClient(conn).SignIntermediate(t.Context(),
					&identityapi.SignIntermediateRequest{Csr: intermediateCSR(t), TtlSeconds: 3600})
				return err
			}},
	}
}
