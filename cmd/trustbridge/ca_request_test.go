package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// grpcServer starts `trustbridge server` for example.org with the
// certificate service on loopback and a bootstrap token for laptopID. It
// returns the service's address and a root-cert.pem of the CA.
//
// The token is marked reusable: the tests on this fixture present it many
// times, to SDS and to the certificate service, to test other things
// (refusals, agents, SDS). Single-use tokens, the default, are tested in
// tokens_test.go.
func grpcServer(t *testing.T, mutate ...func(*server.Config)) (addr, rootCert, dataDir string) {
	t.Helper()
	return grpcServerWithTokens(t, servertest.LaptopToken+","+servertest.LaptopID.String()+",reusable\n", mutate...)
}

// grpcServerWithTokens is grpcServer with the token file's content.
func grpcServerWithTokens(t *testing.T, lines string, mutate ...func(*server.Config)) (addr, rootCert, dataDir string) {
	t.Helper()
	dataDir = t.TempDir()
	tokens := filepath.Join(t.TempDir(), "tokens.csv")
	require.NoError(t, os.WriteFile(tokens, []byte(lines), 0o600))
	_, banner := startServer(t, dataDir, append([]func(*server.Config){func(o *server.Config) {
		o.GRPC = server.GRPCConfig{Listen: "127.0.0.1:0", BootstrapFile: tokens, TokenReview: server.TokenReviewOff}
	}}, mutate...)...)
	addr = servertest.GRPCAddr(t, banner.String())

	_, roots, err := ca.NewStore(dataDir).Load("example.org")
	require.NoError(t, err)
	var certs []*x509.Certificate
	for _, r := range roots {
		certs = append(certs, r.Cert)
	}
	rootCert = filepath.Join(t.TempDir(), "root-cert.pem")
	require.NoError(t, os.WriteFile(rootCert, cli.CertsPEM(certs), 0o644))
	return addr, rootCert, dataDir
}

// checkCreds verifies the files `ca request` wrote and returns the leaf.
func checkCreds(t *testing.T, dir string, want spiffeid.ID) *x509.Certificate {
	t.Helper()
	info, err := os.Stat(filepath.Join(dir, "key.pem"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	leaf, err := loadCreds(dir, want)
	require.NoError(t, err)
	return leaf
}

// loadCreds reads the key, chain and roots in dir once and verifies them
// together: a caller polling a directory the agent is rewriting retries on
// an error instead of failing between the key's rename and the chain's.
func loadCreds(dir string, want spiffeid.ID) (*x509.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "cert-chain.pem"), filepath.Join(dir, "key.pem"))
	if err != nil {
		return nil, fmt.Errorf("the key matches the certificate: %w", err)
	}
	roots, err := cli.ReadPEMCerts(filepath.Join(dir, "root-cert.pem"))
	if err != nil {
		return nil, err
	}
	var chain []*x509.Certificate
	for _, der := range cert.Certificate {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, err
		}
		chain = append(chain, c)
	}
	id, _, err := x509svid.Verify(chain, x509bundle.FromX509Authorities(want.TrustDomain(), roots))
	if err != nil {
		return nil, err
	}
	if id != want {
		return nil, fmt.Errorf("the certificate names %s, not %s", id, want)
	}
	return chain[0], nil
}

func TestCARequestBootstrapThenRenew(t *testing.T) {
	addr, rootCert, _ := grpcServer(t)
	token := servertest.WriteFile(t, servertest.LaptopToken+"\n", 0o600)
	out := filepath.Join(t.TempDir(), "creds")

	stdout, stderr, code := runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert,
		"--token-file", token, "--credentials-dir", out, "--ttl", "2h")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "issued "+servertest.LaptopID.String())
	first := checkCreds(t, out, servertest.LaptopID)
	assert.WithinDuration(t, time.Now().Add(2*time.Hour), first.NotAfter, time.Minute)
	firstKey, err := os.ReadFile(filepath.Join(out, "key.pem"))
	require.NoError(t, err)

	// Renew with the certificate just issued, into another directory.
	renewed := filepath.Join(t.TempDir(), "renewed")
	stdout, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert,
		"--prov-cert", out, "--credentials-dir", renewed)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "issued "+servertest.LaptopID.String())
	second := checkCreds(t, renewed, servertest.LaptopID)
	assert.NotEqual(t, first.SerialNumber, second.SerialNumber)
	secondKey, err := os.ReadFile(filepath.Join(renewed, "key.pem"))
	require.NoError(t, err)
	assert.NotEqual(t, firstKey, secondKey, "a fresh key each time")

	// And in place, with the root-cert.pem it wrote.
	_, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", filepath.Join(renewed, "root-cert.pem"),
		"--renew", "--credentials-dir", renewed, "--spiffe-id", servertest.LaptopID.String())
	require.Equal(t, 0, code, stderr)
	third := checkCreds(t, renewed, servertest.LaptopID)
	assert.NotEqual(t, second.SerialNumber, third.SerialNumber)

	// The names before --credentials-dir and --prov-cert still work for a
	// release, warning on stderr only.
	stdout, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert,
		"--cert-dir", renewed, "--out", renewed)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "--cert-dir is deprecated and goes in a later release; use --prov-cert")
	assert.Contains(t, stderr, "--out is deprecated and goes in a later release; use --credentials-dir")
	assert.NotContains(t, stdout, "deprecated")
	fourth := checkCreds(t, renewed, servertest.LaptopID)
	assert.NotEqual(t, third.SerialNumber, fourth.SerialNumber)
}

func TestCARequestRefusals(t *testing.T) {
	addr, rootCert, _ := grpcServer(t)
	token := servertest.WriteFile(t, servertest.LaptopToken, 0o600)
	otherCA := testca.New(t, "example.org", testca.Options{})
	otherRoot := servertest.WriteFile(t, string(cli.CertsPEM([]*x509.Certificate{otherCA.Cert})), 0o644)
	fedCA := testca.New(t, "other.example", testca.Options{})
	fedRoot := servertest.WriteFile(t, string(cli.CertsPEM([]*x509.Certificate{fedCA.Cert})), 0o644)

	// A certificate issued by another CA of the same trust domain.
	foreignDir := t.TempDir()
	leaf, key := otherCA.Issue(t, servertest.LaptopID)
	require.NoError(t, caclient.WriteCredentials(foreignDir, key, []*x509.Certificate{leaf}, caclient.Trust{TrustDomain: otherCA.TrustDomain, Local: []*x509.Certificate{otherCA.Cert}}))

	// A certificate of ours that has expired by the time it is used.
	expiredDir := filepath.Join(t.TempDir(), "expired")
	_, stderr, code := runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert,
		"--token-file", token, "--credentials-dir", expiredDir, "--ttl", "1h")
	require.Equal(t, 0, code, stderr)

	stopped := servertest.ReservePort(t) // nothing listens there

	tests := []struct {
		name string
		now  func() time.Time
		args []string
		want string
	}{
		{"unknown token", nil, []string{"--ca-addr", addr, "--root-cert", rootCert, "--token-file", servertest.WriteFile(t, "not-the-token-0123456789", 0o600)},
			"did not accept the credentials"},
		{"certificate from another CA", nil, []string{"--ca-addr", addr, "--root-cert", rootCert, "--prov-cert", foreignDir},
			"did not accept the credentials"},
		{"identity not ours", nil, []string{"--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--spiffe-id", "spiffe://example.org/admin"},
			"refused to issue this identity"},
		{"identity of another trust domain", nil, []string{"--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--spiffe-id", "spiffe://other.example/vm/laptop"},
			"not of other.example"},
		{"ttl over the maximum", nil, []string{"--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--ttl", "8760h"},
			"refused the request"},
		{"server not in --root-cert", nil, []string{"--ca-addr", addr, "--root-cert", otherRoot, "--token-file", token},
			"does --root-cert hold its roots"},
		{"roots of another trust domain", nil, []string{"--ca-addr", addr, "--root-cert", fedRoot, "--token-file", token},
			"certificate service of another trust domain: the server presents spiffe://example.org/trustbridge/ca, an identity of example.org, not of other.example: " +
				"point this client at other.example's certificate service, or give it example.org's roots and trust domain"},
		{"server is not the CA", nil, []string{"--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--server-spiffe-id", "spiffe://example.org/trustbridge/bundle-endpoint"},
			"want spiffe://example.org/trustbridge/bundle-endpoint"},
		{"nothing listening", nil, []string{"--ca-addr", stopped, "--root-cert", rootCert, "--token-file", token, "--timeout", "5s"},
			"cannot get a certificate from " + stopped},
		{"expired certificate", func() time.Time { return time.Now().Add(2 * time.Hour) }, []string{"--ca-addr", addr, "--root-cert", rootCert, "--prov-cert", expiredDir},
			"expired at"},
		{"both credentials", nil, []string{"--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--prov-cert", expiredDir},
			"exactly one of --token-file"},
		{"no credentials", nil, []string{"--ca-addr", addr, "--root-cert", rootCert}, "exactly one of --token-file"},
		{"token and --renew", nil, []string{"--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--renew"}, "exactly one of --token-file"},
		{"--renew and --prov-cert", nil, []string{"--ca-addr", addr, "--root-cert", rootCert, "--renew", "--prov-cert", expiredDir}, "exactly one of --token-file"},
		{"--renew without a certificate", nil, []string{"--ca-addr", addr, "--root-cert", rootCert, "--renew"}, "--renew: --credentials-dir"},
		{"old and new name, two directories", nil, []string{"--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--out", t.TempDir()},
			"--out is the old name of --credentials-dir; pass only --credentials-dir"},
		{"--cert-dir and --prov-cert, two directories", nil, []string{"--ca-addr", addr, "--root-cert", rootCert, "--cert-dir", expiredDir, "--prov-cert", foreignDir},
			"pass only --prov-cert, or --renew"},
		{"empty token file", nil, []string{"--ca-addr", addr, "--root-cert", rootCert, "--token-file", servertest.WriteFile(t, "\n", 0o600)}, "is empty"},
		{"token file with two tokens", nil, []string{"--ca-addr", addr, "--root-cert", rootCert, "--token-file", servertest.WriteFile(t, "a b\n", 0o600)}, "more than one"},
		{"oversized token file", nil, []string{"--ca-addr", addr, "--root-cert", rootCert, "--token-file", servertest.WriteFile(t, string(make([]byte, 64<<10)), 0o600)}, "larger than"},
		{"missing root cert", nil, []string{"--ca-addr", addr, "--root-cert", filepath.Join(t.TempDir(), "none.pem"), "--token-file", token}, "--root-cert"},
		{"fractional ttl", nil, []string{"--ca-addr", addr, "--root-cert", rootCert, "--token-file", token, "--ttl", "1.5s"}, "whole"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := tt.now
			if now == nil {
				now = time.Now
			}
			out := filepath.Join(t.TempDir(), "out")
			_, stderr, code := runCLIAt(t, now, "", append([]string{"ca", "request", "--credentials-dir", out}, tt.args...)...)
			assert.Equal(t, 1, code)
			assert.Contains(t, stderr, tt.want)
			assert.NotContains(t, stderr, servertest.LaptopToken)
			_, err := os.Stat(out)
			assert.True(t, os.IsNotExist(err), "nothing written")
		})
	}
}

func TestExpectedServerID(t *testing.T) {
	ours := testca.New(t, "example.org", testca.Options{}).Cert
	theirs := testca.New(t, "other.example", testca.Options{}).Cert
	plain := &x509.Certificate{} // a root without a SPIFFE ID, as plug-in CAs have
	want := spiffeid.RequireFromString("spiffe://want.example/w")
	tests := []struct {
		name  string
		flag  string
		roots []*x509.Certificate
		want  spiffeid.ID
		id    string
		err   string
	}{
		{name: "from the roots", roots: []*x509.Certificate{ours}, id: "spiffe://example.org/trustbridge/ca"},
		{name: "from the requested ID", roots: []*x509.Certificate{plain}, want: want, id: "spiffe://want.example/trustbridge/ca"},
		{name: "requested ID among merged roots", roots: []*x509.Certificate{theirs, ours}, want: spiffeid.RequireFromString("spiffe://example.org/w"), id: "spiffe://example.org/trustbridge/ca"},
		{name: "requested ID not among the roots", roots: []*x509.Certificate{ours}, want: want, err: "not of want.example"},
		{name: "flag", flag: "spiffe://x.example/ca", roots: []*x509.Certificate{ours}, id: "spiffe://x.example/ca"},
		{name: "bad flag", flag: "https://x", err: "--server-spiffe-id"},
		{name: "two trust domains", roots: []*x509.Certificate{ours, theirs}, err: "trust domains"},
		{name: "nothing to go by", roots: []*x509.Certificate{plain}, err: "cannot tell"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := cli.ExpectedServerID(tt.flag, tt.roots, tt.want)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.id, id.String())
		})
	}
}

// TestCARequestTrustPerTrustDomain is the regression test of a peer's CA
// trusted for the local trust domain: with the old default
// (--ca-response-roots merged), ca request wrote every federated root into
// root-cert.pem, and whatever read it as "our roots" (the agent grouped
// roots without a spiffe:// URI SAN under the workload's trust domain)
// accepted a leaf the peer minted for spiffe://example.org/admin. Now, in
// both modes, root-cert.pem holds the local roots alone and the peer's
// root is only in bundle.spiffe.json, under the peer's trust domain. The
// peer here is Istio-style: its root names no trust domain.
func TestCARequestTrustPerTrustDomain(t *testing.T) {
	peer := testca.New(t, "relay.example", testca.Options{Mutate: func(c *x509.Certificate) { c.URIs = nil }})
	doc, err := bundledoc.Marshal(peer.Bundle())
	require.NoError(t, err)
	relay := servertest.WriteFile(t, string(doc), 0o644)
	forged, _ := peer.Issue(t, spiffeid.RequireFromString("spiffe://example.org/admin"))
	peerLeaf, _ := peer.Issue(t, spiffeid.RequireFromString("spiffe://relay.example/api"))
	for _, mode := range []string{server.RootsMerged, server.RootsLocal} {
		t.Run(mode, func(t *testing.T) {
			addr, rootCert, _ := grpcServer(t, func(o *server.Config) {
				o.Bundle = server.BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: server.ProfileSPIFFE, ServeOthers: true,
					Files: []string{"relay.example=" + relay}}
				o.GRPC.ResponseRoots = mode
			})
			local, err := cli.ReadPEMCerts(rootCert)
			require.NoError(t, err)
			out := filepath.Join(t.TempDir(), "creds")
			stdout, stderr, code := runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", rootCert,
				"--token-file", servertest.WriteFile(t, servertest.LaptopToken, 0o600), "--credentials-dir", out)
			require.Equal(t, 0, code, stderr)
			assert.Contains(t, stdout, "bundle.spiffe.json: example.org, relay.example")
			got, err := cli.ReadPEMCerts(filepath.Join(out, "root-cert.pem"))
			require.NoError(t, err)
			assert.Equal(t, local, got, "root-cert.pem: the local roots and nothing else")

			// The trust a workload builds from the files, per trust domain.
			data, err := os.ReadFile(filepath.Join(out, "bundle.spiffe.json"))
			require.NoError(t, err)
			byTD, err := caclient.ParseBundleMap(data)
			require.NoError(t, err)
			require.Equal(t, []*x509.Certificate{peer.Cert}, byTD[peer.TrustDomain])
			set := x509bundle.NewSet()
			for td, roots := range byTD {
				set.Add(x509bundle.FromX509Authorities(td, roots))
			}
			_, _, err = x509svid.Verify([]*x509.Certificate{forged}, set)
			assert.Error(t, err, "the peer's CA must not vouch for spiffe://example.org/admin")
			id, _, err := x509svid.Verify([]*x509.Certificate{peerLeaf}, set)
			require.NoError(t, err, "the peer's CA vouches for its own trust domain")
			assert.Equal(t, "spiffe://relay.example/api", id.String())

			// Renewal with the files it wrote, in place.
			_, stderr, code = runCLIAt(t, time.Now, "", "ca", "request", "--ca-addr", addr, "--root-cert", filepath.Join(out, "root-cert.pem"),
				"--renew", "--credentials-dir", out)
			require.Equal(t, 0, code, stderr)
			checkCreds(t, out, servertest.LaptopID)
		})
	}
}
