package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	jwtcmd "github.com/trustbridge/trustbridge/cmd/trustbridge/cli/jwt"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

const testJWTKID = "test-kid"

// testJWTSigner signs as the CA will (jwtsvid.Mint, ES256): 5 minutes by
// default, at most an hour.
func testJWTSigner(t *testing.T) (certservice.JWTSigner, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return certservice.JWTSignerFunc(func(id spiffeid.ID, aud []string, ttl time.Duration) (string, time.Time, error) {
		switch {
		case ttl == 0:
			ttl = 5 * time.Minute
		case ttl > time.Hour:
			ttl = time.Hour
		}
		now := time.Now().Truncate(time.Second)
		tok, err := jwtsvid.Mint(key, testJWTKID, jwtsvid.Claims{Subject: id, Audience: aud, IssuedAt: now, Expiry: now.Add(ttl)})
		return tok, now.Add(ttl), err
	}), key
}

// bundleWithJWTKey writes a bundle map of example.org holding the
// signer's key, and a single bundle of it, and returns their paths.
func bundleWithJWTKey(t *testing.T, key *ecdsa.PrivateKey) (mapFile, single string) {
	t.Helper()
	b := testca.New(t, "example.org").Bundle().Clone()
	require.NoError(t, b.AddJWTAuthority(testJWTKID, key.Public()))
	doc, err := bundledoc.MarshalMap([]*spiffebundle.Bundle{b, testca.New(t, "partner.example").Bundle()})
	require.NoError(t, err)
	one, err := bundledoc.Marshal(b)
	require.NoError(t, err)
	return servertest.WriteFile(t, string(doc), 0o644), servertest.WriteFile(t, string(one), 0o644)
}

func TestJWTMintAndValidate(t *testing.T) {
	signer, key := testJWTSigner(t)
	addr, rootCert, _ := grpcServer(t, func(o *server.Config) { o.GRPC.TestJWT = signer })
	token := servertest.WriteFile(t, servertest.LaptopToken+"\n", 0o600)
	mapFile, single := bundleWithJWTKey(t, key)

	// With the bootstrap token; the table output is the token alone.
	stdout, stderr, code := runCLI(t, "", "jwt", "mint", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", token,
		"--audience", "https://api.example.com", "--audience", "b", "--ttl", "10m")
	require.Equal(t, 0, code, stderr)
	jwt := strings.TrimSpace(stdout)
	require.NotContains(t, jwt, "\n")

	stdout, stderr, code = runCLI(t, "", "jwt", "validate", "--bundle", mapFile, "--audience", "b", jwt)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "spiffe id:  "+servertest.LaptopID.String())
	assert.Contains(t, stdout, "audience:   https://api.example.com, b")

	// A single bundle with --trust-domain, the token on standard input, JSON.
	stdout, stderr, code = runCLI(t, jwt+"\n", "jwt", "validate", "--bundle", single, "--trust-domain", "example.org", "--audience", "https://api.example.com", "-o", "json", "-")
	require.Equal(t, 0, code, stderr)
	var got jwtcmd.ValidateOutput
	require.NoError(t, json.Unmarshal([]byte(stdout), &got))
	assert.Equal(t, servertest.LaptopID.String(), got.SPIFFEID)
	assert.WithinDuration(t, time.Now().Add(10*time.Minute), got.ExpiresAt, time.Minute)
	assert.Equal(t, servertest.LaptopID.String(), got.Claims["sub"])

	// With the certificate ca request wrote, as JSON.
	creds := filepath.Join(t.TempDir(), "creds")
	_, stderr, code = runCLI(t, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--credentials-dir", creds)
	require.Equal(t, 0, code, stderr)
	stdout, stderr, code = runCLI(t, "", "jwt", "mint", "--ca-addr", addr, "--root-cert", rootCert, "--prov-cert", creds, "--audience", "a", "-o", "json")
	require.Equal(t, 0, code, stderr)
	var minted jwtcmd.MintOutput
	require.NoError(t, json.Unmarshal([]byte(stdout), &minted))
	assert.Equal(t, servertest.LaptopID.String(), minted.SPIFFEID)
	assert.WithinDuration(t, time.Now().Add(5*time.Minute), minted.ExpiresAt, time.Minute, "the server's default")
	_, err := jwtsvid.Validate(minted.Token, caclient.JWTSource(mustParseMap(t, mapFile)), []string{"a"}, nil)
	require.NoError(t, err)
}

func mustParseMap(t *testing.T, path string) []*spiffebundle.Bundle {
	t.Helper()
	doc, err := cli.ReadSmallFile(path, bundledoc.DefaultMaxSize)
	require.NoError(t, err)
	b, err := caclient.ParseBundles(doc, spiffeid.TrustDomain{})
	require.NoError(t, err)
	return b
}

func TestJWTRefusals(t *testing.T) {
	signer, key := testJWTSigner(t)
	addr, rootCert, _ := grpcServer(t, func(o *server.Config) { o.GRPC.TestJWT = signer })
	token := servertest.WriteFile(t, servertest.LaptopToken+"\n", 0o600)
	badToken := servertest.WriteFile(t, "not-the-laptop-token-0123456789\n", 0o600)
	mapFile, _ := bundleWithJWTKey(t, key)
	otherKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	otherMap, _ := bundleWithJWTKey(t, otherKey)

	stdout, stderr, code := runCLI(t, "", "jwt", "mint", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--audience", "a")
	require.Equal(t, 0, code, stderr)
	jwt := strings.TrimSpace(stdout)
	expired, err := jwtsvid.Mint(key, testJWTKID, jwtsvid.Claims{Subject: servertest.LaptopID, Audience: []string{"a"}, IssuedAt: time.Now().Add(-time.Hour), Expiry: time.Now().Add(-time.Minute)})
	require.NoError(t, err)

	conn := []string{"--ca-addr", addr, "--root-cert", rootCert}
	for _, tc := range []struct {
		name    string
		stdin   string
		args    []string
		wantErr string
	}{
		{"mint without audience", "", append([]string{"jwt", "mint", "--token-file", token}, conn...), "--audience is required"},
		{"mint with a bad token", "", append([]string{"jwt", "mint", "--token-file", badToken, "--audience", "a"}, conn...), "did not accept the credentials"},
		{"mint with 17 audiences", "", append([]string{"jwt", "mint", "--token-file", token, "--audience", "1", "--audience", "2", "--audience", "3", "--audience", "4",
			"--audience", "5", "--audience", "6", "--audience", "7", "--audience", "8", "--audience", "9", "--audience", "10", "--audience", "11", "--audience", "12",
			"--audience", "13", "--audience", "14", "--audience", "15", "--audience", "16", "--audience", "17"}, conn...), "at most 16"},
		{"mint without credentials", "", append([]string{"jwt", "mint", "--audience", "a"}, conn...), "exactly one of --token-file"},
		{"mint with a fractional ttl", "", append([]string{"jwt", "mint", "--token-file", token, "--audience", "a", "--ttl", "1.5s"}, conn...), "whole, positive number of seconds"},
		{"wrong audience", "", []string{"jwt", "validate", "--bundle", mapFile, "--audience", "b", jwt}, "not a valid JWT-SVID for audience b"},
		{"another key", "", []string{"jwt", "validate", "--bundle", otherMap, "--audience", "a", jwt}, "not a valid JWT-SVID"},
		{"expired", "", []string{"jwt", "validate", "--bundle", mapFile, "--audience", "a", expired}, "expired"},
		{"garbage", "", []string{"jwt", "validate", "--bundle", mapFile, "--audience", "a", "a.b.c"}, "not a valid JWT-SVID"},
		{"no token", "", []string{"jwt", "validate", "--bundle", mapFile, "--audience", "a"}, "no token"},
		{"single bundle without trust domain", "", []string{"jwt", "validate", "--bundle", servertest.WriteFile(t, `{"keys":[]}`, 0o644), "--audience", "a", jwt}, "--trust-domain"},
		{"bundle and server", "", append([]string{"jwt", "validate", "--bundle", mapFile, "--audience", "a", "--token-file", token, jwt}, conn...), "one or the other"},
		{"server without credentials", "", []string{"jwt", "validate", "--audience", "a", jwt}, "without --bundle"},
		// The server's example.org bundle does not hold the test signer's
		// key: the bundles came from the server, and decided.
		{"server bundles without the key", "", append([]string{"jwt", "validate", "--token-file", token, "--audience", "a", jwt}, conn...), "not a valid JWT-SVID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := runCLI(t, tc.stdin, tc.args...)
			assert.NotEqual(t, 0, code)
			assert.Contains(t, stderr, tc.wantErr)
		})
	}
}

// TestJWTValidateWithServerBundles validates against the bundles
// WatchBundles sends, from a certificate service whose trust holds the
// signer's key.
func TestJWTValidateWithServerBundles(t *testing.T) {
	signer, key := testJWTSigner(t)
	addr, rootCert, token := identityServer(t, signer, key)
	stdout, stderr, code := runCLI(t, "", "jwt", "mint", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--audience", "a")
	require.Equal(t, 0, code, stderr)
	stdout, stderr, code = runCLI(t, strings.TrimSpace(stdout), "jwt", "validate", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--audience", "a", "-o", "yaml")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "spiffe_id: "+servertest.LaptopID.String())
}

// identityServer is a certificate service in this process whose local
// bundle carries key as a JWT authority; laptopToken authenticates as
// laptopID.
// mutate, when given, changes the service's config before it starts.
func identityServer(t *testing.T, signer certservice.JWTSigner, key *ecdsa.PrivateKey, mutate ...func(*certservice.Config)) (addr, rootCert, tokenFile string) {
	t.Helper()
	td := servertest.LaptopID.TrustDomain()
	authority, err := ca.New(ca.Config{TrustDomain: td, DataDir: t.TempDir()})
	require.NoError(t, err)
	local := authority.Bundle().Clone()
	require.NoError(t, local.AddJWTAuthority(testJWTKID, key.Public()))
	tokens := authn.AuthenticatorFunc(func(_ context.Context, r authn.Request) (authn.Identity, error) {
		if r.BearerToken != servertest.LaptopToken {
			return authn.Identity{}, authn.ErrInvalidCredentials
		}
		return authn.Identity{ID: servertest.LaptopID, Method: "test-token"}, nil
	})
	cfg := certservice.Config{
		Signer: authority, Authenticator: tokens, JWT: signer,
		Bundles: certservice.BundleSourceFunc(func() ([]*spiffebundle.Bundle, <-chan struct{}) {
			return []*spiffebundle.Bundle{local}, nil
		}),
	}
	for _, m := range mutate {
		m(&cfg)
	}
	svc, err := certservice.New(cfg)
	require.NoError(t, err)
	sc, err := authority.ServingCert(spiffeid.RequireFromPath(td, server.GRPCServingPath), time.Hour)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := certservice.NewServer(svc, certservice.TLSConfig(sc.GetCertificate), ln)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	rootCert = servertest.WriteFile(t, string(cli.CertsPEM(authority.Bundle().X509Authorities())), 0o644)
	return ln.Addr().String(), rootCert, servertest.WriteFile(t, servertest.LaptopToken, 0o600)
}

// TestServerStreamsBundles: the server registers WatchBundles with its
// trust store: a caller gets its own trust domain's bundle.
func TestServerStreamsBundles(t *testing.T) {
	addr, rootCert, _ := grpcServer(t)
	roots, err := cli.ReadPEMCerts(rootCert)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := caclient.Dial(addr, caclient.ServerTLS(roots, spiffeid.RequireFromPath(servertest.LaptopID.TrustDomain(), server.GRPCServingPath), nil), servertest.LaptopToken)
	require.NoError(t, err)
	defer conn.Close()
	b, err := caclient.FetchBundles(ctx, conn, servertest.LaptopID.TrustDomain())
	require.NoError(t, err)
	require.Len(t, b.Bundles, 1)
	assert.Equal(t, "example.org", b.Bundles[0].TrustDomain().Name())
	assert.Empty(t, b.Withheld)
}

func TestClaimText(t *testing.T) {
	assert.Equal(t, "1795574191", jwtcmd.ClaimText(float64(1795574191)), "exp as the token has it, not 1.795574191e+09")
	assert.Equal(t, "1.5", jwtcmd.ClaimText(1.5))
	assert.Equal(t, "spiffe://example.org/x", jwtcmd.ClaimText("spiffe://example.org/x"))
	assert.Equal(t, "[a b]", jwtcmd.ClaimText([]any{"a", "b"}))
}

// `jwt validate --issuer` requires iss to be exactly the issuer, as a
// cloud relying party does; against the server's bundles, the server's
// own --jwt-issuer refuses a token of its trust domain from another.
func TestJWTValidateIssuer(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	// The map holds example.org with key and partner.example with its
	// own key: a partner's token must not pass for our issuer's.
	partnerKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	ours := testca.New(t, "example.org").Bundle().Clone()
	require.NoError(t, ours.AddJWTAuthority(testJWTKID, key.Public()))
	partner := testca.New(t, "partner.example").Bundle().Clone()
	require.NoError(t, partner.AddJWTAuthority("partner-kid", partnerKey.Public()))
	doc, err := bundledoc.MarshalMap([]*spiffebundle.Bundle{ours, partner})
	require.NoError(t, err)
	mapFile := servertest.WriteFile(t, string(doc), 0o644)
	one, err := bundledoc.Marshal(ours)
	require.NoError(t, err)
	single := servertest.WriteFile(t, string(one), 0o644)
	mintWith := func(k *ecdsa.PrivateKey, kid string, sub spiffeid.ID, iss string) string {
		now := time.Now().Truncate(time.Second)
		tok, err := jwtsvid.Mint(k, kid, jwtsvid.Claims{Issuer: iss, Subject: sub, Audience: []string{"sts.amazonaws.com"}, IssuedAt: now, Expiry: now.Add(time.Minute)})
		require.NoError(t, err)
		return tok
	}
	mint := func(iss string) string { return mintWith(key, testJWTKID, servertest.LaptopID, iss) }
	const issuer = "https://oidc.example.org"
	partnerAsOurs := mintWith(partnerKey, "partner-kid", spiffeid.RequireFromString("spiffe://partner.example/api"), issuer)
	td := []string{"--issuer-trust-domain", "example.org"}
	for _, tc := range []struct {
		name, token, issuer string
		extra               []string
		want                string
	}{
		{"our issuer", mint(issuer), issuer, td, ""},
		{"our issuer, single bundle", mint(issuer), issuer, []string{"--bundle", single, "--trust-domain", "example.org"}, ""},
		{"another issuer", mint("https://evil.example"), issuer, td, `its iss "https://evil.example" is not --issuer "https://oidc.example.org"`},
		{"no iss", mint(""), issuer, td, "it carries no iss"},
		{"a federated peer's token naming our issuer", partnerAsOurs, issuer, td, "it is of trust domain partner.example, not example.org"},
		{"a bundle map without the issuer's trust domain", mint(issuer), issuer, nil, "--issuer with a --bundle map needs --issuer-trust-domain"},
		{"no --issuer: iss not checked", mint("https://evil.example"), "", nil, ""},
		{"bad --issuer", mint(issuer), "https://oidc.example.org/", td, "--issuer: issuer \"https://oidc.example.org/\": ends with \"/\""},
		{"--issuer-trust-domain alone", mint(issuer), "", td, "give --issuer too"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"jwt", "validate", "--audience", "sts.amazonaws.com", "-"}
			if !slices.Contains(tc.extra, "--bundle") {
				args = append(args, "--bundle", mapFile)
			}
			args = append(args, tc.extra...)
			if tc.issuer != "" {
				args = append(args, "--issuer", tc.issuer)
			}
			stdout, stderr, code := runCLI(t, tc.token, args...)
			if tc.want == "" {
				require.Equal(t, 0, code, stderr)
				assert.Contains(t, stdout, "valid JWT-SVID")
				return
			}
			assert.NotEqual(t, 0, code)
			assert.Contains(t, stderr, tc.want)
		})
	}

	signer, skey := testJWTSigner(t)
	addr, rootCert, token := identityServer(t, signer, skey, func(cfg *certservice.Config) { cfg.JWTIssuer = issuer })
	serverMint := func(iss string) string {
		now := time.Now().Truncate(time.Second)
		tok, err := jwtsvid.Mint(skey, testJWTKID, jwtsvid.Claims{Issuer: iss, Subject: servertest.LaptopID, Audience: []string{"a"}, IssuedAt: now, Expiry: now.Add(time.Minute)})
		require.NoError(t, err)
		return tok
	}
	args := []string{"jwt", "validate", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--audience", "a", "-"}
	_, stderr, code := runCLI(t, serverMint(issuer), args...)
	assert.Equal(t, 0, code, stderr)
	_, stderr, code = runCLI(t, serverMint(issuer), append(args, "--issuer", issuer)...)
	assert.Equal(t, 0, code, stderr)
	_, stderr, code = runCLI(t, serverMint("https://evil.example"), args...)
	assert.NotEqual(t, 0, code)
	assert.Contains(t, stderr, `is not example.org's issuer "https://oidc.example.org"`)
}

// The audiences clouds expect pass through `jwt mint` as they are: AWS
// STS's, a GCP workload identity provider's full resource name, Azure's
// token exchange audience.
func TestJWTMintCloudAudiences(t *testing.T) {
	signer, key := testJWTSigner(t)
	addr, rootCert, token := identityServer(t, signer, key)
	for _, aud := range []string{
		"sts.amazonaws.com",
		"//iam.googleapis.com/projects/123456789012/locations/global/workloadIdentityPools/prod-pool/providers/trustbridge",
		"api://AzureADTokenExchange",
	} {
		stdout, stderr, code := runCLI(t, "", "jwt", "mint", "--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--audience", aud, "-o", "json")
		require.Equal(t, 0, code, stderr)
		var out struct{ Token string }
		require.NoError(t, json.Unmarshal([]byte(stdout), &out))
		svid, err := jwtsvid.Validate(out.Token, jwtSourceOf(t, key), []string{aud}, nil)
		require.NoError(t, err, aud)
		assert.Equal(t, []string{aud}, svid.Audience)
	}
}

// jwtSourceOf is example.org's JWT bundle holding key.
func jwtSourceOf(t *testing.T, key *ecdsa.PrivateKey) *jwtbundle.Bundle {
	t.Helper()
	b := jwtbundle.New(spiffeid.RequireTrustDomainFromString("example.org"))
	require.NoError(t, b.AddJWTAuthority(testJWTKID, key.Public()))
	return b
}
