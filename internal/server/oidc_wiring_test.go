package server

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// The chain runs X509-SVID, TokenReview, the issuers, bootstrap tokens,
// and the start-up record names it in that order. (Building TokenReview
// connects to nothing, so an unreachable API server will do.)
func TestAuthenticatorsChainOrder(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	kc := servertest.WriteFile(t, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, 0o600)
	tokens := servertest.WriteFile(t, servertest.LaptopToken+","+servertest.LaptopID.String()+"\n", 0o600)
	g := &grpcEndpoint{}
	chain, err := g.authenticators(GRPCConfig{TokenReview: TokenReviewOn, Kubeconfig: kc, BootstrapFile: tokens,
		OIDC: OIDCConfig{File: servertest.WriteFile(t, servertest.CIIssuerYAML, 0o644)}, tokenLedger: func() (authn.TokenLedger, error) {
			return authn.OpenFileLedger(filepath.Join(t.TempDir(), "consumed.json"))
		}},
		td, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	var types []string
	for _, a := range chain {
		types = append(types, fmt.Sprintf("%T", a))
	}
	assert.Equal(t, "*authn.X509SVID,*authn.TokenReview,*oidc.Authenticator,*authn.BootstrapTokens", strings.Join(types, ","))
	assert.Equal(t, "x509-svid,kubernetes-jwt,oidc (1 issuers),bootstrap-token", strings.Join(g.methods, ","))
}
