package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// e2eServer is one running trustbridge server of a federation test.
type e2eServer struct {
	td        spiffeid.TrustDomain
	dataDir   string
	admin     string // http://host:port of the admin API
	bundleURL string // the bundle endpoint as the banner names it
	banner    string
	stop      func()
	opts      server.Config // what it was started with, for restart
}

// restart stops s and starts it again with the same options on the same
// data dir: fixed listen addresses come back, others move.
func (s *e2eServer) restart(t *testing.T) {
	t.Helper()
	s.stop()
	admin, banner, stop := launchServer(t, s.opts)
	s.admin, s.banner, s.stop = "http://"+admin, banner, stop
	s.bundleURL = servertest.EndpointURL(t, banner)
}

// startE2EServer runs a server for td on dataDir until stop or the end of
// the test. Unlike startNamedServer it can be stopped early, which the
// bootstrap of an https_spiffe pair needs.
func startE2EServer(t *testing.T, td, dataDir string, mutate func(*server.Config)) *e2eServer {
	t.Helper()
	o := baseServerOptions(td, dataDir)
	o.Bundle = server.BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: server.ProfileSPIFFE, ServeOthers: true}
	o.Federation.MinRefresh = time.Second
	o.Federation.AllowPrivate = true
	if mutate != nil {
		mutate(&o)
	}
	admin, banner, stop := launchServer(t, o)
	return &e2eServer{
		td: spiffeid.RequireTrustDomainFromString(td), dataDir: dataDir, admin: "http://" + admin,
		bundleURL: servertest.EndpointURL(t, banner), banner: banner, stop: stop, opts: o,
	}
}

// bootstrapDataDir starts and stops a server once so that its data dir
// holds a CA, and returns that CA's roots: the bundle an operator hands a
// peer out of band before https_spiffe can work.
func bootstrapDataDir(t *testing.T, td string) (dataDir string, roots []*x509.Certificate) {
	t.Helper()
	dataDir = t.TempDir()
	startE2EServer(t, td, dataDir, nil).stop()
	_, rs, err := ca.NewStore(dataDir).Load(td)
	require.NoError(t, err)
	for _, r := range rs {
		roots = append(roots, r.Cert)
	}
	require.NotEmpty(t, roots)
	return dataDir, roots
}

// startSPIFFEPair starts east.example and west.example federated with each
// other over https_spiffe. A CA root exists only after a server's first
// start and the peer's config needs it, so each data dir is bootstrapped
// first and the bundle endpoints then get ports reserved up front.
func startSPIFFEPair(t *testing.T, eastMutate, westMutate func(*server.Config)) (east, west *e2eServer) {
	t.Helper()
	eastData, eastRoots := bootstrapDataDir(t, "east.example")
	westData, westRoots := bootstrapDataDir(t, "west.example")
	eastAddr, westAddr := servertest.ReservePort(t), servertest.ReservePort(t)
	eastCfg := servertest.WriteSPIFFEFederationConfig(t, "west.example", westAddr, westRoots)
	westCfg := servertest.WriteSPIFFEFederationConfig(t, "east.example", eastAddr, eastRoots)
	east = startE2EServer(t, "east.example", eastData, func(o *server.Config) {
		o.Bundle.Listen = eastAddr
		o.Federation.ConfigFile = eastCfg
		if eastMutate != nil {
			eastMutate(o)
		}
	})
	west = startE2EServer(t, "west.example", westData, func(o *server.Config) {
		o.Bundle.Listen = westAddr
		o.Federation.ConfigFile = westCfg
		if westMutate != nil {
			westMutate(o)
		}
	})
	return east, west
}

// federationStatus reads s's GET /v1/federation entry for td; ok is false
// while there is none yet.
func federationStatus(t *testing.T, s *e2eServer, td string) (api.FederationStatus, bool) {
	t.Helper()
	code, body := servertest.Get(t, s.admin+"/v1/federation")
	var all []api.FederationStatus
	if code != http.StatusOK || json.Unmarshal([]byte(body), &all) != nil {
		return api.FederationStatus{}, false
	}
	for _, st := range all {
		if st.TrustDomain == td {
			return st, true
		}
	}
	return api.FederationStatus{}, false
}

// waitFederated waits until s holds a bundle of td fetched from its
// endpoint, with at least sequence minSeq.
func waitFederated(t *testing.T, s *e2eServer, td string, minSeq uint64, timeout time.Duration) api.FederationStatus {
	t.Helper()
	var st api.FederationStatus
	require.Eventually(t, func() bool {
		var ok bool
		st, ok = federationStatus(t, s, td)
		return ok && st.State == string(federation.StateOK) && st.LastSuccess != nil && st.Sequence != nil && *st.Sequence >= minSeq
	}, timeout, 20*time.Millisecond, "%s never federated with %s (seq >= %d): last status %+v", s.td.Name(), td, minSeq, st)
	return st
}

// ownVerifier trusts only s's own roots as stored in its data dir and
// accepts only s's bundle endpoint: how a workload of s's trust domain
// authenticates its own server's https_spiffe endpoint.
func ownVerifier(t *testing.T, s *e2eServer) *trust.Verifier {
	t.Helper()
	_, rs, err := ca.NewStore(s.dataDir).Load(s.td.Name())
	require.NoError(t, err)
	var roots []*x509.Certificate
	for _, r := range rs {
		roots = append(roots, r.Cert)
	}
	store := trust.NewStore()
	store.Set("bootstrap", spiffebundle.FromX509Authorities(s.td, roots))
	return &trust.Verifier{Bundles: store, Authorizer: tlsconfig.AuthorizeID(
		spiffeid.RequireFromString("spiffe://" + s.td.Name() + "/trustbridge/bundle-endpoint"))}
}

// fetchBundleMap reads s's /bundle-map over https_spiffe with tlsCfg.
func fetchBundleMap(t *testing.T, s *e2eServer, tlsCfg *tls.Config) map[spiffeid.TrustDomain]*spiffebundle.Bundle {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	defer client.CloseIdleConnections()
	resp, err := client.Get(strings.TrimSuffix(s.bundleURL, "/") + "/bundle-map")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	bundles, _, err := bundledoc.ReadMap(resp.Body, 0)
	require.NoError(t, err)
	out := map[spiffeid.TrustDomain]*spiffebundle.Bundle{}
	for _, b := range bundles {
		out[b.TrustDomain()] = b
	}
	return out
}

// peerVerifier is the verifier of a workload of s's trust domain talking to
// a workload of peer: its store holds only peer's bundle, as s relays it on
// /bundle-map, so a chain verifies against that trust domain's roots or not
// at all.
func peerVerifier(t *testing.T, s *e2eServer, serverTLS *tls.Config, peer spiffeid.TrustDomain, peerID spiffeid.ID) (*trust.Verifier, *spiffebundle.Bundle) {
	t.Helper()
	b, ok := fetchBundleMap(t, s, serverTLS)[peer]
	require.True(t, ok, "%s relays no bundle for %s", s.td.Name(), peer.Name())
	store := trust.NewStore()
	store.Set("bundle-map", b)
	return &trust.Verifier{Bundles: store, Authorizer: tlsconfig.AuthorizeID(peerID)}, b
}

// issueWorkload issues an X509-SVID for id from the running server's CA.
func issueWorkload(t *testing.T, s *e2eServer, id string) *tls.Certificate {
	t.Helper()
	out := filepath.Join(t.TempDir(), "creds")
	_, stderr, code := runCLIAt(t, time.Now, "", "ca", "issue", "--data-dir", s.dataDir, "--spiffe-id", id, "--credentials-dir", out, "--ttl", "1h")
	require.Equal(t, 0, code, stderr)
	cert, err := tls.LoadX509KeyPair(filepath.Join(out, "cert-chain.pem"), filepath.Join(out, "key.pem"))
	require.NoError(t, err)
	return &cert
}

// mtls runs one handshake between a server and a client workload over
// loopback TCP and returns each side's error. The server writes a byte
// after its handshake so the client also learns a rejection of its
// certificate (with TLS 1.3 the client finishes first).
func mtls(t *testing.T, serverCfg, clientCfg *tls.Config) (serverErr, clientErr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srvDone := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			srvDone <- err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		tc := tls.Server(c, serverCfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			srvDone <- err
			return
		}
		_, err = tc.Write([]byte{1})
		srvDone <- err
	}()
	d := tls.Dialer{Config: clientCfg}
	c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err == nil {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = io.ReadFull(c, make([]byte, 1))
		_ = c.Close()
	}
	return <-srvDone, err
}

func staticCert(c *tls.Certificate) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c, nil }
}

func staticClientCert(c *tls.Certificate) func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c, nil }
}

// servedSequence is the sequence s publishes for its own trust domain.
func servedSequence(t *testing.T, s *e2eServer) uint64 {
	t.Helper()
	b, ok := fetchBundleMap(t, s, trust.ClientTLSConfig(nil, ownVerifier(t, s)))[s.td]
	require.True(t, ok)
	seq, ok := b.SequenceNumber()
	require.True(t, ok)
	return seq
}

func TestFederationE2ESPIFFEBothWays(t *testing.T) {
	east, west := startSPIFFEPair(t, nil, nil)

	// East polled west before west listened; it retries with backoff.
	eastSt := waitFederated(t, east, "west.example", 1, 30*time.Second)
	westSt := waitFederated(t, west, "east.example", 1, 30*time.Second)
	assert.Equal(t, string(federation.ProfileHTTPSSPIFFE), eastSt.Profile)
	assert.Equal(t, "spiffe://west.example/trustbridge/bundle-endpoint", eastSt.EndpointSPIFFEID)
	assert.Equal(t, servedSequence(t, west), *eastSt.Sequence)
	assert.Equal(t, servedSequence(t, east), *westSt.Sequence)
	assert.Len(t, x509Held(eastSt.Authorities), 1)
	assert.Len(t, x509Held(westSt.Authorities), 1)

	eastID := spiffeid.RequireFromString("spiffe://east.example/api")
	westID := spiffeid.RequireFromString("spiffe://west.example/client")
	eastCert := issueWorkload(t, east, eastID.String())
	westCert := issueWorkload(t, west, westID.String())

	// Each workload learns the peer's bundle from its own server, over
	// https_spiffe authenticated with its own trust domain's roots.
	eastTrust, westBundle := peerVerifier(t, east, trust.ClientTLSConfig(nil, ownVerifier(t, east)), west.td, westID)
	westTrust, eastBundle := peerVerifier(t, west, trust.ClientTLSConfig(nil, ownVerifier(t, west)), east.td, eastID)
	assert.Equal(t, servedSequence(t, west), mustSeq(t, westBundle))
	assert.Equal(t, servedSequence(t, east), mustSeq(t, eastBundle))

	serverErr, clientErr := mtls(t,
		mtlsServer(staticCert(eastCert), eastTrust),
		trust.ClientTLSConfig(staticClientCert(westCert), westTrust))
	require.NoError(t, serverErr, "east workload accepts west's")
	require.NoError(t, clientErr, "west workload accepts east's")

	t.Run("roots are not merged across trust domains", func(t *testing.T) {
		// An east store without west's bundle rejects the west
		// workload outright, whatever the authorizer allows.
		onlyEast := trust.NewStore()
		onlyEast.Set("bundle-map", eastBundle)
		serverErr, _ := mtls(t,
			mtlsServer(staticCert(eastCert), &trust.Verifier{Bundles: onlyEast, Authorizer: tlsconfig.AuthorizeAny()}),
			trust.ClientTLSConfig(staticClientCert(westCert), westTrust))
		assert.ErrorIs(t, serverErr, trust.ErrUnknownDomain)

		// West's bundle relabelled as east's: the east workload's chain
		// does not verify against it.
		fake := spiffebundle.FromX509Authorities(east.td, westBundle.X509Authorities())
		wrong := trust.NewStore()
		wrong.Set("bundle-map", fake)
		_, clientErr := mtls(t,
			mtlsServer(staticCert(eastCert), eastTrust),
			trust.ClientTLSConfig(staticClientCert(westCert), &trust.Verifier{Bundles: wrong, Authorizer: tlsconfig.AuthorizeMemberOf(east.td)}))
		assert.ErrorIs(t, clientErr, trust.ErrChain)
	})
}

func mustSeq(t *testing.T, b *spiffebundle.Bundle) uint64 {
	t.Helper()
	seq, ok := b.SequenceNumber()
	require.True(t, ok, "bundle of %s has no sequence", b.TrustDomain().Name())
	return seq
}

func TestFederationE2EWebBothWays(t *testing.T) {
	// Both bundle endpoints serve a Web PKI certificate from a private
	// CA (IP SAN 127.0.0.1); each side trusts that CA through
	// --federation-ca-file. https_web needs no bootstrap bundle, only the
	// ports up front.
	dir := t.TempDir()
	web := testca.New(t, "web.test")
	leaf, key := web.Issue(t, spiffeid.RequireFromString("spiffe://web.test/x"), testca.Options{Mutate: func(c *x509.Certificate) {
		c.URIs = nil
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}})
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile, caFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.pem")
	require.NoError(t, os.WriteFile(certFile, cli.CertsPEM([]*x509.Certificate{leaf}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pemBlock("PRIVATE KEY", der), 0o600))
	require.NoError(t, os.WriteFile(caFile, cli.CertsPEM([]*x509.Certificate{web.Cert}), 0o600))

	eastAddr, westAddr := servertest.ReservePort(t), servertest.ReservePort(t)
	webConfig := func(peer, addr string) string {
		path := filepath.Join(dir, peer+".yaml")
		cfg := "federation:\n  - trustDomain: " + peer + "\n    bundleEndpointURL: https://" + addr +
			"/\n    bundleEndpointProfile: {type: https_web}\n"
		require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
		return path
	}
	webServer := func(td, addr, cfg string) *e2eServer {
		return startE2EServer(t, td, t.TempDir(), func(o *server.Config) {
			o.Bundle = server.BundleConfig{Listen: addr, Path: "/", Profile: server.ProfileWeb, TLSCert: certFile, TLSKey: keyFile, ServeOthers: true}
			o.Federation.ConfigFile = cfg
			o.Federation.CAFile = caFile
		})
	}
	east := webServer("east.example", eastAddr, webConfig("west.example", westAddr))
	west := webServer("west.example", westAddr, webConfig("east.example", eastAddr))

	eastSt := waitFederated(t, east, "west.example", 1, 30*time.Second)
	westSt := waitFederated(t, west, "east.example", 1, 30*time.Second)
	assert.Equal(t, string(federation.ProfileHTTPSWeb), eastSt.Profile)
	assert.Equal(t, string(federation.ProfileHTTPSWeb), westSt.Profile)
	assert.Len(t, x509Held(eastSt.Authorities), len(caRootsOf(t, west)))
	assert.Len(t, x509Held(westSt.Authorities), len(caRootsOf(t, east)))

	// Workloads read the peer's bundle from their own server over
	// https_web, with the private CA as the only root.
	pool := x509.NewCertPool()
	pool.AddCert(web.Cert)
	webTLS := tlsConfigWithRoots(pool)
	eastID := spiffeid.RequireFromString("spiffe://east.example/api")
	westID := spiffeid.RequireFromString("spiffe://west.example/client")
	eastCert := issueWorkload(t, east, eastID.String())
	westCert := issueWorkload(t, west, westID.String())
	eastTrust, westBundle := peerVerifier(t, east, webTLS, west.td, westID)
	westTrust, eastBundle := peerVerifier(t, west, webTLS, east.td, eastID)
	assert.True(t, westBundle.X509Authorities()[0].Equal(caRootsOf(t, west)[0]))
	assert.True(t, eastBundle.X509Authorities()[0].Equal(caRootsOf(t, east)[0]))

	serverErr, clientErr := mtls(t,
		mtlsServer(staticCert(eastCert), eastTrust),
		trust.ClientTLSConfig(staticClientCert(westCert), westTrust))
	require.NoError(t, serverErr, "east workload accepts west's")
	require.NoError(t, clientErr, "west workload accepts east's")
}

func caRootsOf(t *testing.T, s *e2eServer) []*x509.Certificate {
	t.Helper()
	_, rs, err := ca.NewStore(s.dataDir).Load(s.td.Name())
	require.NoError(t, err)
	var roots []*x509.Certificate
	for _, r := range rs {
		roots = append(roots, r.Cert)
	}
	return roots
}

func TestFederationE2ERootRotation(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the server's CA recheck (up to 30s)")
	}
	east, west := startSPIFFEPair(t,
		func(o *server.Config) { o.RefreshHint = 2 * time.Second },
		func(o *server.Config) { o.Federation.MinRefresh = time.Second })
	before := *waitFederated(t, west, "east.example", 1, 30*time.Second).Sequence
	waitFederated(t, east, "west.example", 1, 30*time.Second)
	oldRoots := caRootsOf(t, east)
	require.Len(t, oldRoots, 1)

	eastID := spiffeid.RequireFromString("spiffe://east.example/api")
	westID := spiffeid.RequireFromString("spiffe://west.example/client")
	oldEastCert := issueWorkload(t, east, eastID.String())
	westCert := issueWorkload(t, west, westID.String())
	eastTrust, _ := peerVerifier(t, east, trust.ClientTLSConfig(nil, ownVerifier(t, east)), west.td, westID)

	// The west workload keeps one store and refreshes east's bundle in
	// it from west's /bundle-map, as an SDS client would.
	westTLS := trust.ClientTLSConfig(nil, ownVerifier(t, west))
	westStore := trust.NewStore()
	westTrust := &trust.Verifier{Bundles: westStore, Authorizer: tlsconfig.AuthorizeID(eastID)}
	refreshWest := func() *spiffebundle.Bundle {
		b, ok := fetchBundleMap(t, west, westTLS)[east.td]
		require.True(t, ok)
		westStore.Set("bundle-map", b)
		return b
	}
	refreshWest()
	// Eventually runs conditions on another goroutine and may leave one
	// running when it gives up.
	var mu sync.Mutex
	var failed []error
	handshakes := 0
	handshake := func(eastCert *tls.Certificate) {
		serverErr, clientErr := mtls(t,
			mtlsServer(staticCert(eastCert), eastTrust),
			trust.ClientTLSConfig(staticClientCert(westCert), westTrust))
		mu.Lock()
		defer mu.Unlock()
		handshakes++
		if serverErr != nil || clientErr != nil {
			failed = append(failed, fmt.Errorf("server: %v, client: %v", serverErr, clientErr))
		}
	}

	_, stderr, code := runCLIAt(t, time.Now, "", "ca", "rotate", "--data-dir", east.dataDir)
	require.Equal(t, 0, code, stderr)
	rotated := time.Now()

	// East publishes the prepared root at its next recheck (30s); west
	// picks it up within one refresh hint. Handshakes with the old
	// workload certificate keep working all along.
	var st api.FederationStatus
	require.Eventually(t, func() bool {
		handshake(oldEastCert)
		refreshWest()
		var ok bool
		st, ok = federationStatus(t, west, "east.example")
		return ok && st.Sequence != nil && *st.Sequence > before && len(x509Held(st.Authorities)) == 2
	}, 60*time.Second, 250*time.Millisecond, "west never saw east's new root: %+v", st)
	t.Logf("west saw east's new root (sequence %d -> %d) %s after ca rotate", before, *st.Sequence, time.Since(rotated).Round(time.Millisecond))
	assert.Equal(t, string(federation.StateOK), st.State)
	newRoots := caRootsOf(t, east)
	require.Len(t, newRoots, 2)

	// Five refresh hints later east signs with the new root; a workload
	// certificate from it verifies in west's trust too.
	var newEastCert *tls.Certificate
	require.Eventually(t, func() bool {
		handshake(oldEastCert)
		c := issueWorkload(t, east, eastID.String())
		issuer := c.Certificate[len(c.Certificate)-1]
		for _, r := range oldRoots {
			if bytes.Equal(r.Raw, issuer) {
				return false
			}
		}
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			return false
		}
		for _, r := range oldRoots {
			if leaf.CheckSignatureFrom(r) == nil {
				return false
			}
		}
		newEastCert = c
		return true
	}, 60*time.Second, 500*time.Millisecond, "east never signed with its new root")
	t.Logf("east signs with its new root %s after ca rotate", time.Since(rotated).Round(time.Millisecond))
	refreshWest()
	handshake(newEastCert)
	handshake(oldEastCert)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d handshakes during the rotation", handshakes)
	assert.Empty(t, failed, "every handshake during the rotation succeeds")

	// Both audit trails tell the story: east prepared and activated its
	// new root, west accepted east's bundles that added it.
	var newFP string
	for _, r := range newRoots {
		if !r.Equal(oldRoots[0]) {
			newFP = "x509:" + servertest.SHA256Hex(r.Raw)
		}
	}
	eastLog := servertest.ReadAuditLog(t, east.dataDir)
	assert.Contains(t, auditEvents(eastLog, "east.example"), "root_prepared")
	assert.Contains(t, auditEvents(eastLog, "east.example"), "root_activated")
	var sawNewRoot bool
	for _, e := range servertest.ReadAuditLog(t, west.dataDir) {
		if e.Event == "bundle_accepted" && e.TrustDomain == "east.example" && slices.Contains(e.Added, newFP) {
			sawNewRoot = true
			assert.Equal(t, east.bundleURL, e.SourceURL)
			require.NotNil(t, e.OldSequence)
			assert.Greater(t, *e.NewSequence, *e.OldSequence)
		}
	}
	assert.True(t, sawNewRoot, "west's audit log records the bundle that added east's new root %s", newFP)
}

// mtlsServer is the server side of a federated workload's mTLS, as a Go
// program embedding trustbridge would write it: v verifies the client's
// X509-SVID in VerifyConnection, which runs on resumed handshakes too,
// and session tickets are off besides.
func mtlsServer(getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error), v *trust.Verifier) *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS12,
		GetCertificate:         getCert,
		ClientAuth:             tls.RequireAnyClientCert,
		SessionTicketsDisabled: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := v.VerifyCertificates(cs.PeerCertificates, x509.ExtKeyUsageClientAuth)
			return err
		},
	}
}
