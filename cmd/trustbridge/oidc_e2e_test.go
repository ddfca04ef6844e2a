package main

import (
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/authn/oidc/oidctest"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// ciIssuerConfig is an --oidc-config naming iss as "ci": tokens of the
// acme organisation's jobs become spiffe://example.org/ci/<owner>/<job>.
func ciIssuerConfig(t *testing.T, iss *oidctest.Issuer) string {
	t.Helper()
	caFile := servertest.WriteFile(t, string(iss.CAPEM()), 0o644)
	return servertest.WriteFile(t, fmt.Sprintf(`issuers:
- name: ci
  issuer: %s
  audiences: [example.org]
  caFile: %s
  allowPrivateAddresses: true
  claims:
  - claim: repository_owner
    values: [acme]
  spiffeID: "spiffe://{{.TrustDomain}}/ci/{{.Claims.repository_owner}}/{{.Claims.job}}"
`, iss.URL(), caFile), 0o644)
}

// ciToken is a token of iss for a job of owner.
func ciToken(t *testing.T, iss *oidctest.Issuer, owner, job string) string {
	t.Helper()
	claims := iss.StandardClaims("repo:"+owner+"/app:ref:refs/heads/main", "example.org")
	claims["repository_owner"] = owner
	claims["job"] = job
	return iss.Mint(claims)
}

// TestOIDCIssuerE2E: a CI job with its platform's OIDC token gets an SVID
// from `ca request`, a JWT-SVID from `jwt mint` and its certificate over
// SDS, with the identity the issuer's template names; it renews with the
// SVID; tokens the rules refuse get PermissionDenied, forged or expired
// ones Unauthenticated, each with its reason logged.
func TestOIDCIssuerE2E(t *testing.T) {
	iss := oidctest.New(t)
	cfg := ciIssuerConfig(t, iss)
	var dataDir string
	srv := startAttackTarget(t, func(o *server.Config) {
		o.GRPC.OIDC = server.OIDCConfig{File: cfg}
		dataDir = o.DataDir
	})
	addr, logs := srv.grpc, srv.logs
	assert.Contains(t, logs.String(), `"authenticators":"x509-svid,oidc (1 issuers),bootstrap-token"`,
		"the start-up record names the chain in its order")
	rootCert := rootCertFile(t, dataDir)
	want := spiffeid.RequireFromString("spiffe://example.org/ci/acme/build")

	good := servertest.WriteFile(t, ciToken(t, iss, "acme", "build"), 0o600)
	out := filepath.Join(t.TempDir(), "creds")
	stdout, stderr, code := runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert,
		"--token-file", good, "--credentials-dir", out)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "issued "+want.String())
	leaf := checkCreds(t, out, want)
	g, err := authn.GrantFromCert(leaf)
	require.NoError(t, err)
	assert.Equal(t, authn.MethodOIDC, g.Method)
	assert.Equal(t, "ci", g.Ref, "the grant names the issuer")

	// The SVID renews itself: the issuer is still configured.
	renewed := filepath.Join(t.TempDir(), "renewed")
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert,
		"--prov-cert", out, "--credentials-dir", renewed)
	require.Equal(t, 0, code, stderr)
	checkCreds(t, renewed, want)

	// A JWT-SVID for the same identity.
	stdout, stderr, code = runCLI(t, "", "jwt", "mint", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", good,
		"--audience", "https://api.example.com", "-o", "json")
	require.Equal(t, 0, code, stderr)
	var minted struct {
		SPIFFEID string `json:"spiffe_id"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &minted), stdout)
	assert.Equal(t, want.String(), minted.SPIFFEID)

	// SDS: Envoy authenticating with the token gets its own certificate.
	roots, err := cli.ReadPEMCerts(rootCert)
	require.NoError(t, err)
	tok, err := os.ReadFile(good)
	require.NoError(t, err)
	env := openEnvoy(t, dialSDSTLS(t, addr, want.TrustDomain(), roots, strings.TrimSpace(string(tok))), nil, "default")
	r := env.recv(10 * time.Second)
	require.NotNil(t, r)
	id, _ := workloadCert(t, secrets(t, r)["default"], want.TrustDomain(), roots)
	assert.Equal(t, want, id)

	refusals := []struct {
		name, token, stderr string
	}{
		{"another organisation", ciToken(t, iss, "evil", "build"), "refused to issue this identity: the token is valid, but its claims do not grant an identity"},
		{"a job name that is a path", ciToken(t, iss, "acme", "../admin"), "its claims do not grant an identity"},
		{"alg none", iss.NoneAlg(iss.StandardClaims("x", "example.org")), "did not accept the credentials"},
		{"HMAC keyed with the public key", iss.HMACWithPublicKey(iss.StandardClaims("x", "example.org")), "did not accept the credentials"},
		{"another audience", func() string {
			c := iss.StandardClaims("x", "someone-else")
			c["repository_owner"], c["job"] = "acme", "build"
			return iss.Mint(c)
		}(), "did not accept the credentials"},
		{"expired", func() string {
			c := iss.StandardClaims("x", "example.org")
			c["repository_owner"], c["job"] = "acme", "build"
			c["iat"], c["nbf"], c["exp"] = time.Now().Add(-2*time.Hour).Unix(), time.Now().Add(-2*time.Hour).Unix(), time.Now().Add(-time.Hour).Unix()
			return iss.Mint(c)
		}(), "did not accept the credentials"},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			_, stderr, code := runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert,
				"--token-file", servertest.WriteFile(t, tt.token, 0o600), "--credentials-dir", t.TempDir())
			assert.Equal(t, 1, code)
			assert.Contains(t, stderr, tt.stderr)
			assert.NotContains(t, stderr, tt.token, "the token is never echoed")
		})
	}
	// The reasons are in the server's log, without the tokens, and
	// counted by kind.
	assert.Contains(t, logs.String(), `"reason":"token_claims_refused","code":"PermissionDenied"`)
	for _, tt := range refusals {
		assert.NotContains(t, logs.String(), tt.token)
	}
	// The admin API shows the issuer and its keys.
	code, body := servertest.Get(t, "http://"+srv.admin+"/v1/authn/issuers")
	require.Equal(t, 200, code)
	var issuers struct {
		Issuers []struct {
			Name, Kind, Issuer string
			Keys               int
			LastSuccess        string `json:"last_success"`
			LastError          string `json:"last_error"`
		}
	}
	require.NoError(t, json.Unmarshal([]byte(body), &issuers), body)
	require.Len(t, issuers.Issuers, 1)
	is := issuers.Issuers[0]
	assert.Equal(t, "ci", is.Name)
	assert.Equal(t, "oidc", is.Kind)
	assert.Equal(t, iss.URL(), is.Issuer)
	assert.Equal(t, 1, is.Keys)
	assert.NotEmpty(t, is.LastSuccess)
	assert.Empty(t, is.LastError)

	for result, want := range map[string]float64{
		// ca request, its renewal is X509-SVID; jwt mint; SDS.
		"accepted": 3, "refused_rules": 1, "refused_template": 1, "refused_alg": 2,
		"refused_audience": 1, "refused_time": 1,
	} {
		assert.Equal(t, want, srv.metric(t, "trustbridge_authn_oidc_tokens_total", `issuer="ci"`, `result="`+result+`"`), result)
	}
}

// rootCertFile writes the roots of the CA in dataDir to a root-cert.pem.
func rootCertFile(t *testing.T, dataDir string) string {
	t.Helper()
	_, roots, err := ca.NewStore(dataDir).Load("example.org")
	require.NoError(t, err)
	var certs []*x509.Certificate
	for _, r := range roots {
		certs = append(certs, r.Cert)
	}
	path := filepath.Join(t.TempDir(), "root-cert.pem")
	require.NoError(t, os.WriteFile(path, cli.CertsPEM(certs), 0o644))
	return path
}
