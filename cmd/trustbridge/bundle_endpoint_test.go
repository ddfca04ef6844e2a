package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func TestServerBundleEndpointWebProfileAndRelay(t *testing.T) {
	dir := t.TempDir()
	web := testca.New(t, "web.test")
	leaf, key := web.Issue(t, spiffeid.RequireFromString("spiffe://web.test/x"), testca.Options{Mutate: func(c *x509.Certificate) {
		c.URIs = nil
		c.DNSNames = []string{"localhost"}
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}})
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	require.NoError(t, os.WriteFile(certFile, cli.CertsPEM([]*x509.Certificate{leaf}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pemBlock("PRIVATE KEY", der), 0o600))

	peer := testca.New(t, "peer.example")
	peerDoc, err := bundledoc.Marshal(peer.Bundle())
	require.NoError(t, err)
	peerFile := filepath.Join(dir, "peer.json")
	require.NoError(t, os.WriteFile(peerFile, peerDoc, 0o600))

	dataDir := t.TempDir()
	_, out := startServer(t, dataDir, func(o *server.Config) {
		o.Bundle = server.BundleConfig{Listen: "127.0.0.1:0", Path: "/bundle", Profile: server.ProfileWeb,
			TLSCert: certFile, TLSKey: keyFile, Files: []string{"peer.example=" + peerFile}, ServeOthers: true}
	})
	url := servertest.EndpointURL(t, out.String())
	require.True(t, strings.HasSuffix(url, "/bundle"))
	pool := x509.NewCertPool()
	pool.AddCert(web.Cert)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	td := spiffeid.RequireTrustDomainFromString("example.org")
	got, err := federation.FetchBundle(ctx, td, url, federation.WithWebPKIRoots(pool))
	require.NoError(t, err)
	assert.Len(t, got.X509Authorities(), 1)

	// The relayed peer bundle, at /bundles/{td}.
	base := strings.TrimSuffix(url, "/bundle")
	relayed, err := federation.FetchBundle(ctx, spiffeid.RequireTrustDomainFromString("peer.example"), base+"/bundles/peer.example", federation.WithWebPKIRoots(pool))
	require.NoError(t, err)
	assert.True(t, relayed.Equal(spiffebundle.FromX509Authorities(peer.TrustDomain, []*x509.Certificate{peer.Cert})))

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfigWithRoots(pool)}}
	resp, err := client.Get(base + "/bundle-map")
	require.NoError(t, err)
	defer resp.Body.Close()
	bundles, _, err := bundledoc.ReadMap(resp.Body, 0)
	require.NoError(t, err)
	assert.Len(t, bundles, 2)
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func tlsConfigWithRoots(pool *x509.CertPool) *tls.Config {
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

func TestServerBundleEndpointStaticMode(t *testing.T) {
	dir := t.TempDir()
	web := testca.New(t, "web.test")
	leaf, key := web.Issue(t, spiffeid.RequireFromString("spiffe://web.test/x"), testca.Options{Mutate: func(c *x509.Certificate) {
		c.URIs = nil
		c.DNSNames = []string{"localhost"}
	}})
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	require.NoError(t, os.WriteFile(certFile, cli.CertsPEM([]*x509.Certificate{leaf}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pemBlock("PRIVATE KEY", der), 0o600))

	// An offline CA's bundle, without a refresh hint of its own.
	offline := testca.New(t, "example.org")
	b := offline.Bundle()
	b.SetSequenceNumber(41)
	doc, err := bundledoc.Marshal(b)
	require.NoError(t, err)
	static := filepath.Join(dir, "static.json")
	require.NoError(t, os.WriteFile(static, doc, 0o600))

	_, out := startServer(t, t.TempDir(), func(o *server.Config) {
		o.RefreshHint = 2 * time.Minute
		o.Bundle = server.BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: server.ProfileWeb, TLSCert: certFile, TLSKey: keyFile, Files: []string{static}}
	})
	url := servertest.EndpointURL(t, out.String())
	assert.True(t, strings.HasPrefix(url, "https://localhost:"), "peers are told the certificate's name: %s", url)
	pool := x509.NewCertPool()
	pool.AddCert(web.Cert)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := federation.FetchBundle(ctx, spiffeid.RequireTrustDomainFromString("example.org"), url, federation.WithWebPKIRoots(pool))
	require.NoError(t, err)
	assert.True(t, got.X509Authorities()[0].Equal(offline.Cert), "the file's bundle, not the CA's")
	seq, _ := got.SequenceNumber()
	assert.Equal(t, uint64(41), seq)
	hint, ok := got.RefreshHint()
	assert.True(t, ok)
	assert.Equal(t, 2*time.Minute, hint, "--bundle-refresh-hint fills in a file without a hint")
}
