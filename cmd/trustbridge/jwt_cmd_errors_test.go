package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// What `jwt mint` and `jwt validate` say when the server cannot help: a
// reason the person running them can act on, not a guess.
func TestJWTIdentityErrors(t *testing.T) {
	signer, key := testJWTSigner(t)
	partnerKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	partnerToken, err := jwtsvid.Mint(partnerKey, "partner-kid", jwtsvid.Claims{Subject: spiffeid.RequireFromString("spiffe://partner.example/api"),
		Audience: []string{"a"}, IssuedAt: time.Now(), Expiry: time.Now().Add(time.Hour)})
	require.NoError(t, err)

	for _, tc := range []struct {
		name    string
		mutate  func(t *testing.T, cfg *certservice.Config)
		args    []string
		want    string
		notWant string
	}{
		{name: "validate: trust domain withheld", mutate: withholdPartner, args: []string{"validate", "--audience", "a", partnerToken},
			want: "grants you only for some peers", notWant: "no bundle found"},
		{name: "mint: the CA cannot sign", mutate: func(_ *testing.T, cfg *certservice.Config) {
			cfg.JWT = certservice.JWTSignerFunc(func(spiffeid.ID, []string, time.Duration) (string, time.Time, error) {
				return "", time.Time{}, fmt.Errorf("ca: %w", ca.ErrInvalidSigningMaterial)
			})
		}, args: []string{"mint", "--audience", "a"}, want: "the CA cannot sign JWT-SVIDs right now", notWant: "--grpc-listen"},
		{name: "mint: older server", mutate: olderServer, args: []string{"mint", "--audience", "a"}, want: "predates trustbridge's identity service"},
		{name: "validate: older server", mutate: olderServer, args: []string{"validate", "--audience", "a", partnerToken}, want: "predates trustbridge's identity service"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, rootCert, token := identityServer(t, signer, key, func(cfg *certservice.Config) { tc.mutate(t, cfg) })
			args := append([]string{"jwt"}, tc.args...)
			args = append(args, "--ca-addr", addr, "--root-cert", rootCert, "--token-file", token)
			_, stderr, code := runCLI(t, "", args...)
			assert.NotEqual(t, 0, code)
			assert.Contains(t, stderr, tc.want)
			if tc.notWant != "" {
				assert.NotContains(t, stderr, tc.notWant)
			}
		})
	}
}

// withholdPartner adds partner.example to the server's trust, granted to
// the caller only for one of its peers.
func withholdPartner(t *testing.T, cfg *certservice.Config) {
	local, _ := cfg.Bundles.Bundles()
	bundles := []*spiffebundle.Bundle{local[0], testca.New(t, "partner.example").Bundle()}
	cfg.Bundles = certservice.BundleSourceFunc(func() ([]*spiffebundle.Bundle, <-chan struct{}) { return bundles, nil })
	p, err := trustpolicy.Compile(servertest.LaptopID.TrustDomain(), trustpolicy.DefaultDeny, []trustpolicy.Rule{{
		Name:         "laptop",
		Workloads:    []trustpolicy.Selector{{SPIFFEID: servertest.LaptopID.String()}},
		TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: "partner.example", Peers: []string{"spiffe://partner.example/api"}}},
	}})
	require.NoError(t, err)
	cfg.Policy = certservice.AccessPolicyFunc(func(ident authn.Identity) (trustpolicy.Decision, <-chan struct{}) {
		return p.Decide(trustpolicy.SubjectOf(ident)), nil
	})
}

// olderServer serves certificates only, as servers before the identity
// service did.
func olderServer(_ *testing.T, cfg *certservice.Config) { cfg.JWT, cfg.Bundles = nil, nil }

// A token on the command line leaks through /proc/PID/cmdline and shell
// history: validate warns, once, on standard error; not for standard
// input.
func TestJWTValidateWarnsAboutTokenInArgs(t *testing.T) {
	signer, key := testJWTSigner(t)
	mapFile, _ := bundleWithJWTKey(t, key)
	token, _, err := signer.SignJWT(servertest.LaptopID, []string{"a"}, 0)
	require.NoError(t, err)
	const warning = "warning: a token on the command line is readable by other users"
	for _, tc := range []struct {
		name  string
		stdin string
		arg   []string
		warns bool
	}{
		{"argument", "", []string{token}, true},
		{"dash", token, []string{"-"}, false},
		{"no argument", token, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := runCLI(t, tc.stdin, append([]string{"jwt", "validate", "--bundle", mapFile, "--audience", "a"}, tc.arg...)...)
			require.Equal(t, 0, code, stderr)
			assert.Contains(t, stdout, "valid JWT-SVID")
			if tc.warns {
				assert.Equal(t, 1, strings.Count(stderr, warning))
			} else {
				assert.NotContains(t, stderr, warning)
			}
		})
	}
}
