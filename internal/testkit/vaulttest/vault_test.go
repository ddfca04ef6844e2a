package vaulttest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	jwtauth "github.com/hashicorp/vault-plugin-auth-jwt"
	"github.com/hashicorp/vault/sdk/logical"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	trustDomain = "vault.example"
	webID       = "spiffe://" + trustDomain + "/ns/app/sa/web"
	otherID     = "spiffe://" + trustDomain + "/ns/app/sa/other"
	// audience is the one the Vault roles are bound to.
	audience = "vault.example.test"
	// bootstrapToken grants webID, reusable: every mint presents it.
	bootstrapToken = "vault-web-bootstrap-token-0123456789"
)

// TestVaultJWTAuth: Vault's JWT auth method, configured with trustbridge's
// issuer (OIDC discovery, or the JWKS URL with bound_issuer), lets a
// JWT-SVID from `trustbridge jwt mint` log in to a role bound to its
// SPIFFE ID and audience, as that SPIFFE ID, and refuses it for a role
// bound to another SPIFFE ID, as it refuses a JWT-SVID for another
// audience; with each --jwt-key-type the server signs with.
func TestVaultJWTAuth(t *testing.T) {
	bin := trustbridgeBinary(t)
	for _, keyType := range []string{"ES256", "ES384", "RS256"} {
		t.Run(keyType, func(t *testing.T) { testVaultJWTAuth(t, bin, keyType) })
	}
}

func testVaultJWTAuth(t *testing.T, bin, keyType string) {
	dir := t.TempDir()
	caPEM, certFile, keyFile := writeServingCert(t, dir)
	port := freeLoopbackPort(t)
	issuer := fmt.Sprintf("https://127.0.0.1:%d/oidc", port)

	tokens := filepath.Join(dir, "bootstrap-tokens")
	require.NoError(t, os.WriteFile(tokens, fmt.Appendf(nil, "%s,%s,reusable\n", bootstrapToken, webID), 0o600))
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(bootstrapToken), 0o600))

	dataDir := filepath.Join(dir, "data")
	srv := startServer(t, bin,
		"--trust-domain", trustDomain,
		"--data-dir", dataDir, "--init",
		"--admin-listen", "127.0.0.1:0",
		"--bundle-listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--bundle-profile", "https_web",
		"--bundle-tls-cert", certFile,
		"--bundle-tls-key", keyFile,
		"--jwt-issuer", issuer,
		"--jwt-key-type", keyType,
		"--grpc-listen", "127.0.0.1:0",
		"--bootstrap-token-file", tokens,
		"--token-review", "off",
		"--log-format", "json",
	)
	rootCert := caRootFile(t, dataDir, dir)

	webJWT := mint(t, bin, srv, rootCert, tokenFile, audience)
	otherAudJWT := mint(t, bin, srv, rootCert, tokenFile, "other.example.test")
	claims := jwtPayload(t, webJWT)
	require.Equal(t, issuer, claims["iss"], "the JWT-SVID's issuer is --jwt-issuer")
	require.Equal(t, webID, claims["sub"])
	require.Equal(t, keyType, jwtHeader(t, webJWT)["alg"], "--jwt-key-type signs it")

	t.Run("discovery document and JWKS", func(t *testing.T) {
		assertIssuerDocuments(t, issuer, caPEM, webJWT)
	})

	t.Run("oidc_discovery_url", func(t *testing.T) {
		b, storage := newBackend(t)
		write(t, b, storage, "config", map[string]any{
			"oidc_discovery_url":    issuer,
			"oidc_discovery_ca_pem": caPEM,
		})
		assertLogins(t, b, storage, webJWT, otherAudJWT)
	})

	t.Run("jwks_url with bound_issuer", func(t *testing.T) {
		b, storage := newBackend(t)
		config := map[string]any{
			"jwks_url":     issuer + "/keys",
			"jwks_ca_pem":  caPEM,
			"bound_issuer": issuer,
		}
		write(t, b, storage, "config", config)
		assertLogins(t, b, storage, webJWT, otherAudJWT)

		// The issuer Vault checks is the token's: another bound_issuer
		// refuses it.
		config["bound_issuer"] = issuer + "/other"
		write(t, b, storage, "config", config)
		assertRefused(t, login(t, b, storage, "web", webJWT), "iss")
	})
}

// assertLogins writes the roles web (bound to webID and audience) and
// other (bound to otherID), and checks that webJWT logs in to web alone,
// as webID, and that otherAudJWT (webID's, for another audience) does not.
func assertLogins(t *testing.T, b logical.Backend, storage logical.Storage, webJWT, otherAudJWT string) {
	t.Helper()
	role := func(subject string) map[string]any {
		return map[string]any{
			"role_type":       "jwt",
			"user_claim":      "sub",
			"bound_subject":   subject,
			"bound_audiences": []string{audience},
			"token_policies":  []string{"app"},
			"claim_mappings":  map[string]any{"sub": "spiffe_id"},
		}
	}
	write(t, b, storage, "role/web", role(webID))
	write(t, b, storage, "role/other", role(otherID))

	resp := login(t, b, storage, "web", webJWT)
	require.False(t, resp.IsError(), "login to role web refused: %v", resp.Error())
	require.NotNil(t, resp.Auth, "login to role web returned no auth")
	require.NotNil(t, resp.Auth.Alias)
	assert.Equal(t, webID, resp.Auth.Alias.Name, "the entity alias is the SPIFFE ID (user_claim sub)")
	assert.Equal(t, webID, resp.Auth.Alias.Metadata["spiffe_id"], "claim_mappings sub=spiffe_id")
	assert.Equal(t, webID, resp.Auth.Metadata["spiffe_id"])
	assert.Equal(t, "web", resp.Auth.Metadata["role"])
	assert.Equal(t, webID, resp.Auth.DisplayName)
	assert.Contains(t, resp.Auth.Policies, "app")

	assertRefused(t, login(t, b, storage, "other", webJWT), "sub")
	assertRefused(t, login(t, b, storage, "web", otherAudJWT), "aud")
}

// assertRefused checks that a login was refused, naming claim (as the
// validator's "invalid subject (sub) claim" does).
func assertRefused(t *testing.T, resp *logical.Response, claim string) {
	t.Helper()
	require.True(t, resp.IsError(), "login should be refused (%s), got auth %+v", claim, resp.Auth)
	assert.Nil(t, resp.Auth)
	assert.Contains(t, resp.Error().Error(), "("+claim+")", "refused for its %s claim", claim)
}

// newBackend is Vault's JWT auth method as Vault mounts it, over in-memory
// storage, as the plugin's own tests build it; it is cleaned up (its
// provider context cancelled) when the test ends.
func newBackend(t *testing.T) (logical.Backend, logical.Storage) {
	t.Helper()
	storage := &logical.InmemStorage{}
	logs := &testWriter{t: t}
	t.Cleanup(logs.stop)
	b, err := jwtauth.Factory(context.Background(), &logical.BackendConfig{
		Logger: hclog.New(&hclog.LoggerOptions{Name: "auth-jwt", Level: hclog.Debug, Output: logs}),
		System: &logical.StaticSystemView{
			DefaultLeaseTTLVal: 12 * time.Hour,
			MaxLeaseTTLVal:     24 * time.Hour,
		},
		StorageView: storage,
	})
	require.NoError(t, err)
	t.Cleanup(func() { b.Cleanup(context.Background()) })
	return b, storage
}

// write is `vault write auth/jwt/<path> data...`, which must succeed:
// an update, or a create where the path has an existence check that finds
// nothing there yet (a new role), as Vault's router decides.
func write(t *testing.T, b logical.Backend, storage logical.Storage, path string, data map[string]any) {
	t.Helper()
	ctx := context.Background()
	req := &logical.Request{Operation: logical.UpdateOperation, Path: path, Storage: storage, Data: data}
	checked, exists, err := b.HandleExistenceCheck(ctx, req)
	require.NoError(t, err, "existence check of %s", path)
	if checked && !exists {
		req.Operation = logical.CreateOperation
	}
	resp, err := b.HandleRequest(ctx, req)
	require.NoError(t, err, "write %s", path)
	if resp != nil {
		require.False(t, resp.IsError(), "write %s: %v", path, resp.Error())
	}
}

// login is `vault write auth/jwt/login role=ROLE jwt=TOKEN`; a refusal is
// an error response, not an error.
func login(t *testing.T, b logical.Backend, storage logical.Storage, role, token string) *logical.Response {
	t.Helper()
	resp, err := b.HandleRequest(context.Background(), &logical.Request{
		Operation: logical.UpdateOperation, Path: "login", Storage: storage,
		Data: map[string]any{"role": role, "jwt": token},
	})
	require.NoError(t, err, "login to role %s", role)
	require.NotNil(t, resp, "login to role %s: no response", role)
	return resp
}

// testWriter sends the backend's log to the test's, until the test ends.
type testWriter struct {
	mu      sync.Mutex
	t       *testing.T
	stopped bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
}

// mint is `trustbridge jwt mint -o json` with the bootstrap token: a
// JWT-SVID of webID for aud.
func mint(t *testing.T, bin string, srv *server, rootCert, tokenFile, aud string) string {
	t.Helper()
	out := runCLI(t, bin, "jwt", "mint", "--ca-addr", srv.grpcAddr, "--root-cert", rootCert,
		"--token-file", tokenFile, "--audience", aud, "-o", "json")
	var minted struct {
		SPIFFEID string `json:"spiffe_id"`
		Token    string `json:"token"`
	}
	require.NoError(t, json.Unmarshal(out, &minted), "jwt mint -o json: %s", out)
	require.Equal(t, webID, minted.SPIFFEID)
	require.NotEmpty(t, minted.Token)
	return minted.Token
}

// jwtPayload is a JWT's claims, unverified.
func jwtPayload(t *testing.T, token string) map[string]any { return jwtPart(t, token, 1) }

// jwtHeader is a JWT's protected header.
func jwtHeader(t *testing.T, token string) map[string]any { return jwtPart(t, token, 0) }

func jwtPart(t *testing.T, token string, i int) map[string]any {
	t.Helper()
	parts := strings.Split(token, ".")
	require.Len(t, parts, 3, "a JWS in compact form")
	raw, err := base64.RawURLEncoding.DecodeString(parts[i])
	require.NoError(t, err)
	var v map[string]any
	require.NoError(t, json.Unmarshal(raw, &v))
	return v
}

// assertIssuerDocuments checks what any OIDC relying party reads, beyond
// what Vault's plugin needs: the discovery document names the issuer and
// <issuer>/keys, and every key of the JWKS carries kid, alg and use sig,
// one of them the kid that signed token.
func assertIssuerDocuments(t *testing.T, issuer, caPEM, token string) {
	t.Helper()
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM([]byte(caPEM)))
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	get := func(url string, v any) {
		t.Helper()
		resp, err := client.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s: %s", url, body)
		require.NoError(t, json.Unmarshal(body, v), "GET %s: %s", url, body)
	}
	var discovery struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	get(issuer+"/.well-known/openid-configuration", &discovery)
	assert.Equal(t, issuer, discovery.Issuer)
	assert.Equal(t, issuer+"/keys", discovery.JWKSURI)

	var jwks struct {
		Keys []map[string]any `json:"keys"`
	}
	get(issuer+"/keys", &jwks)
	require.NotEmpty(t, jwks.Keys)
	header := jwtHeader(t, token)
	signer := false
	for _, k := range jwks.Keys {
		assert.NotEmpty(t, k["kid"], "key %v", k)
		assert.NotEmpty(t, k["alg"], "key %v", k)
		assert.Equal(t, "sig", k["use"], "key %v", k)
		if k["kid"] == header["kid"] {
			signer = true
			assert.Equal(t, header["alg"], k["alg"], "the signing key's alg is the token's")
		}
	}
	assert.True(t, signer, "no key in the JWKS has the token's kid %v", header["kid"])
}

// caRootFile writes the CA's roots, read from its state directory, to a
// new file in dir: --root-cert for jwt mint.
func caRootFile(t *testing.T, dataDir, dir string) string {
	t.Helper()
	pems, err := filepath.Glob(filepath.Join(dataDir, "ca", "roots", "*.crt.pem"))
	require.NoError(t, err)
	require.NotEmpty(t, pems, "no roots in the CA state directory")
	var all []byte
	for _, p := range pems {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		all = append(all, b...)
	}
	path := filepath.Join(dir, "root-cert.pem")
	require.NoError(t, os.WriteFile(path, all, 0o644))
	return path
}

// freeLoopbackPort is a loopback port that was free a moment ago: the
// issuer URL names the bundle endpoint's port, so it is chosen before the
// server starts.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	return port
}

// writeServingCert writes a throwaway CA and a certificate it signs for
// 127.0.0.1 (an IP SAN) and localhost, for the https_web bundle endpoint,
// and returns the CA's PEM and the certificate's and key's files.
func writeServingCert(t *testing.T, dir string) (caPEM, certFile, keyFile string) {
	t.Helper()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "vaulttest throwaway CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	leafDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}, ca, key.Public(), caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)

	caPEM = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))
	certFile = filepath.Join(dir, "bundle-tls.crt")
	keyFile = filepath.Join(dir, "bundle-tls.key")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}), 0o644))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	return caPEM, certFile, keyFile
}
