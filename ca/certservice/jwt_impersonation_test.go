package certservice_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// A node agent gets a JWT-SVID of a workload of its node, granted as the
// workload's certificate is: the token's subject is the workload, never
// the agent; a workload not on the node, a caller proven by a
// certificate, or a server without impersonation is refused.
func TestMintJWTSVIDImpersonated(t *testing.T) {
	pods := newNodePods(shopWeb)
	f, signer := jwtFixture(t, func(cfg *certservice.Config) {
		cfg.Authenticator = append(cfg.Authenticator.(authn.Chain), nodeAgentTokens)
		cfg.Impersonator = pods
	})
	agent := f.identityClient(t, nil, nodeAgentToken)

	resp, err := agent.MintJWTSVID(t.Context(), &identityapi.MintJWTSVIDRequest{Audience: []string{"db"}, ImpersonatedIdentity: shopWeb.String()})
	require.NoError(t, err)
	assert.Equal(t, shopWeb.String(), resp.GetSpiffeId())
	sub, aud, _, _ := signer.last()
	assert.Equal(t, shopWeb, sub, "signed for the workload")
	assert.Equal(t, []string{"db"}, aud)

	for _, tc := range []struct {
		name   string
		client identityapi.IdentityServiceClient
		target string
		code   codes.Code
		msg    string
	}{
		{"not on the node", agent, shopAPI.String(), codes.PermissionDenied, "may not have a JWT-SVID for " + shopAPI.String()},
		{"not a workload", agent, "spiffe://example.org", codes.InvalidArgument, "impersonated_identity"},
		{"another trust domain", agent, "spiffe://other.example/ns/shop/sa/web", codes.PermissionDenied, "not of its trust domain example.org"},
		{"a certificate", f.identityClient(t, svid(t, f.authority, nodeAgentID), ""), shopWeb.String(), codes.PermissionDenied, "needs a caller authenticated by its own token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.client.MintJWTSVID(t.Context(), &identityapi.MintJWTSVIDRequest{Audience: []string{"db"}, ImpersonatedIdentity: tc.target})
			require.Error(t, err)
			assert.Equal(t, tc.code, status.Code(err))
			assert.Contains(t, status.Convert(err).Message(), tc.msg)
		})
	}

	pods.set(shopWeb, true, errors.Join(authn.ErrUnavailable, errors.New("informer not synced")))
	_, err = agent.MintJWTSVID(t.Context(), &identityapi.MintJWTSVIDRequest{Audience: []string{"db"}, ImpersonatedIdentity: shopWeb.String()})
	assert.Equal(t, codes.Unavailable, status.Code(err), "the node authorizer cannot decide")
}

// Without an Impersonator no JWT-SVID is minted for anyone but the
// caller.
func TestMintJWTSVIDImpersonationOff(t *testing.T) {
	f, _ := jwtFixture(t, func(cfg *certservice.Config) {
		cfg.Authenticator = append(cfg.Authenticator.(authn.Chain), nodeAgentTokens)
	})
	_, err := f.identityClient(t, nil, nodeAgentToken).MintJWTSVID(t.Context(),
		&identityapi.MintJWTSVIDRequest{Audience: []string{"db"}, ImpersonatedIdentity: shopWeb.String()})
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "impersonation is not enabled")
}
