package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/go-jose/go-jose/v4"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	spiffejwt "github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var oidcWorkload = spiffeid.RequireFromString("spiffe://east.example/ns/app/sa/web")

// A cloud's view of trustbridge as an OIDC issuer: go-oidc's verifier,
// given only the issuer URL, discovers the JWKS on the https_web bundle
// endpoint and verifies JWT-SVIDs a real agent's Workload API hands a
// workload, across a JWT key rotation: a token of the new key verifies as
// soon as it is minted (the verifier refetches on the unknown kid), and
// once the old key left the JWKS, a token it signed is refused by a
// relying party that fetched since, on the signature alone. The agent's
// ValidateJWTSVID takes our issuer's tokens.
func TestOIDCDiscoveryE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a JWT key rotation (about 30s)")
	}
	web, certFile, keyFile := webCertFiles(t)
	addr := servertest.ReservePort(t)
	issuer := "https://" + addr + "/oidc"
	jwtFlags := jwtKeyConfig(t, "--jwt-key-ttl=10m", "--max-jwt-svid-ttl=10s", "--jwt-issuer="+issuer)
	tokens := servertest.WriteTokenFile(t, eastToken+","+oidcWorkload.String()+",reusable\n")
	s := startE2EServer(t, "east.example", t.TempDir(), func(o *server.Config) {
		o.RefreshHint = 2 * time.Second
		o.JWT = jwtFlags
		o.Bundle = server.BundleConfig{Listen: addr, Path: "/", Profile: server.ProfileWeb, TLSCert: certFile, TLSKey: keyFile, ServeOthers: true}
		o.GRPC = server.GRPCConfig{Listen: "127.0.0.1:0", BootstrapFile: tokens, TokenReview: server.TokenReviewOff}
	})
	wlAddr := workloadAgent(t, s, eastToken)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	roots := x509.NewCertPool()
	roots.AddCert(web.Cert)
	rp := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	rpCtx := oidc.ClientContext(ctx, rp)
	verifier := func(cfg oidc.Config) *oidc.IDTokenVerifier {
		p, err := oidc.NewProvider(rpCtx, issuer)
		require.NoError(t, err, "discovery from the issuer URL alone")
		return p.Verifier(&cfg)
	}
	client, err := workloadapi.New(ctx, workloadapi.WithAddr(wlAddr))
	require.NoError(t, err)
	defer client.Close()
	audience := 0
	fetch := func() *spiffejwt.SVID {
		// A new audience each time: the agent caches a token per
		// audience set for half its life.
		audience++
		svid, err := client.FetchJWTSVID(ctx, spiffejwt.Params{Audience: "sts.amazonaws.com", ExtraAudiences: []string{"n" + strconv.Itoa(audience)}})
		require.NoError(t, err)
		return svid
	}

	// The agent serves JWT-SVIDs once it holds its own identity.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, err := client.FetchJWTSVID(ctx, spiffejwt.Params{Audience: "sts.amazonaws.com"})
		assert.NoError(c, err)
	}, 30*time.Second, 100*time.Millisecond)
	v := verifier(oidc.Config{ClientID: "sts.amazonaws.com"})
	first := fetch()
	tok, err := v.Verify(rpCtx, first.Marshal())
	require.NoError(t, err, "a JWT-SVID from the agent, verified as AWS would")
	assert.Equal(t, oidcWorkload.String(), tok.Subject)
	assert.Equal(t, issuer, tok.Issuer)
	_, err = verifier(oidc.Config{ClientID: "api://AzureADTokenExchange"}).Verify(rpCtx, first.Marshal())
	assert.ErrorContains(t, err, "expected audience", "a token for another audience is refused")
	got, err := client.ValidateJWTSVID(ctx, first.Marshal(), "sts.amazonaws.com")
	require.NoError(t, err, "the agent validates our issuer's tokens")
	assert.Equal(t, oidcWorkload, got.ID)

	start := time.Now()
	oldKID := kidOf(t, first.Marshal())
	_, stderr, code := runCLIAt(t, time.Now, "", "ca", "rotate", "--jwt", "--data-dir", s.dataDir)
	require.Equal(t, 0, code, stderr)
	var rotated *spiffejwt.SVID
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		svid := fetch()
		assert.NotEqual(c, oldKID, kidOf(t, svid.Marshal()), "the successor signs")
		rotated = svid
	}, 2*time.Minute, 500*time.Millisecond)
	t.Logf("the successor signed %s after ca rotate --jwt", time.Since(start).Round(time.Second))
	_, err = v.Verify(rpCtx, rotated.Marshal())
	require.NoError(t, err, "the new key's token verifies as soon as it is minted, with the verifier that cached the old key")

	// The old key leaves the JWKS once every token it signed expired. A
	// relying party that fetched since refuses the old key's token even
	// with the expiry check off: the signature alone fails.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, err := verifier(oidc.Config{ClientID: "sts.amazonaws.com", SkipExpiryCheck: true}).Verify(rpCtx, first.Marshal())
		assert.ErrorContains(c, err, "failed to verify signature")
	}, 2*time.Minute, 500*time.Millisecond)
	t.Logf("the old key left the JWKS %s after ca rotate --jwt", time.Since(start).Round(time.Second))
	_, err = verifier(oidc.Config{ClientID: "sts.amazonaws.com"}).Verify(rpCtx, fetch().Marshal())
	assert.NoError(t, err)
}

// jwtKeyConfig is the JWT flags of trustbridge server, parsed from args.
func jwtKeyConfig(t *testing.T, args ...string) server.JWTKeyConfig {
	t.Helper()
	var o server.Config
	fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
	o.AddFlags(fs)
	require.NoError(t, fs.Parse(args))
	return o.JWT
}

// webCertFiles writes a Web PKI certificate for 127.0.0.1 and its key,
// issued by the returned CA.
func webCertFiles(t *testing.T) (web *testca.CA, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	web = testca.New(t, "web.test")
	leaf, key := web.Issue(t, spiffeid.RequireFromString("spiffe://web.test/x"), testca.Options{Mutate: func(c *x509.Certificate) {
		c.URIs = nil
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}})
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	require.NoError(t, os.WriteFile(certFile, cli.CertsPEM([]*x509.Certificate{leaf}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pemBlock("PRIVATE KEY", der), 0o600))
	return web, certFile, keyFile
}

func kidOf(t *testing.T, token string) string {
	t.Helper()
	jws, err := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{jose.ES256, jose.ES384, jose.RS256})
	require.NoError(t, err)
	return jws.Signatures[0].Header.KeyID
}
