package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

const eastToken = "east-bootstrap-token-0123456789"

var eastWorkload = spiffeid.RequireFromString("spiffe://east.example/ns/default/sa/client")

// workloadAgent starts `trustbridge agent` for the workload token buys at
// s, serving the Workload API, and returns its socket's address as
// SPIFFE_ENDPOINT_SOCKET takes it.
func workloadAgent(t *testing.T, s *e2eServer, token string) string {
	t.Helper()
	o := agentFor(t, servertest.GRPCAddr(t, s.banner), cli.CertsPEM(caRootsOf(t, s)), token)
	o.WorkloadSocket = filepath.Join(filepath.Dir(o.Socket), "api.sock")
	startAgent(t, o)
	// startAgent waits for the SDS socket; the Workload API's may come a
	// moment later, and a client that dials before it is refused.
	require.Eventually(t, func() bool {
		fi, err := os.Stat(o.WorkloadSocket)
		return err == nil && fi.Mode()&os.ModeSocket != 0
	}, 30*time.Second, 10*time.Millisecond, "the agent's Workload API socket never appeared")
	abs, err := filepath.Abs(o.WorkloadSocket)
	require.NoError(t, err)
	return "unix://" + abs
}

func x509Source(t *testing.T, ctx context.Context, addr string) *workloadapi.X509Source {
	t.Helper()
	src, err := workloadapi.NewX509Source(ctx, workloadapi.WithClientOptions(workloadapi.WithAddr(addr)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	return src
}

// authorities counts the X.509 authorities src holds for td (0 when none).
func authorities(src *workloadapi.X509Source, td spiffeid.TrustDomain) int {
	b, err := src.GetX509BundleForTrustDomain(td)
	if err != nil {
		return 0
	}
	return len(b.X509Authorities())
}

// TestWorkloadAPIE2E is issue 17's end-to-end case, with go-spiffe's own
// Workload API client on both sides: east.example and west.example
// federate over https_spiffe, an agent serves each trust domain's
// workload, the workloads talk mTLS with spiffetls and over HTTPS (the
// README's example program, run as written), a JWT-SVID minted in east is
// validated by west's agent, and both CAs rotate their roots while every
// source stays open: each workload sees its own new root and its peer's.
func TestWorkloadAPIE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a federated pair and two agents, and waits for both CAs to rotate")
	}
	grpcWith := func(tokens string) func(*server.Config) {
		return func(o *server.Config) {
			o.RefreshHint = 2 * time.Second
			o.GRPC = server.GRPCConfig{Listen: "127.0.0.1:0", BootstrapFile: tokens, TokenReview: server.TokenReviewOff}
		}
	}
	east, west := startSPIFFEPair(t,
		grpcWith(servertest.WriteTokenFile(t, eastToken+","+eastWorkload.String()+",reusable\n")),
		grpcWith(servertest.WriteTokenFile(t, westToken+","+westWorkload.String()+",reusable\n")))
	waitFederated(t, east, "west.example", 1, 30*time.Second)
	waitFederated(t, west, "east.example", 1, 30*time.Second)
	eastAddr, westAddr := workloadAgent(t, east, eastToken), workloadAgent(t, west, westToken)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	eastSrc, westSrc := x509Source(t, ctx, eastAddr), x509Source(t, ctx, westAddr)
	eastSVID, err := eastSrc.GetX509SVID()
	require.NoError(t, err)
	assert.Equal(t, eastWorkload, eastSVID.ID)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, 1, authorities(eastSrc, west.td), "east's workload trusts west")
		assert.Equal(c, 1, authorities(westSrc, east.td), "west's workload trusts east")
	}, 30*time.Second, 50*time.Millisecond)

	ln, err := spiffetls.ListenWithMode(ctx, "tcp", "127.0.0.1:0", spiffetls.MTLSServerWithSource(tlsconfig.AuthorizeMemberOf(east.td), westSrc))
	require.NoError(t, err)
	url := "https://" + ln.Addr().String() + "/"
	westClient, err := workloadapi.New(ctx, workloadapi.WithAddr(westAddr))
	require.NoError(t, err)
	defer westClient.Close()
	serveWest(t, ln, westClient, url)

	// The README's example, as written, as east's workload: its
	// X509-SVID, a JWT-SVID for west's URL, mTLS to west, and west's
	// agent validating the token against east's JWT authorities.
	out := runExample(t, eastAddr, url, "west.example")
	assert.Contains(t, out, "I am "+eastWorkload.String())
	assert.Contains(t, out, "200 OK: hello "+eastWorkload.String())

	token, err := workloadapi.FetchJWTSVID(ctx, jwtsvid.Params{Audience: "spiffe://west.example/ns/default/sa/web"}, workloadapi.WithAddr(eastAddr))
	require.NoError(t, err)
	got, err := westClient.ValidateJWTSVID(ctx, token.Marshal(), "spiffe://west.example/ns/default/sa/web")
	require.NoError(t, err, "a JWT-SVID minted in east validates in west")
	assert.Equal(t, eastWorkload, got.ID)
	// West's workload holds east's JWT authorities itself, too, and can
	// validate offline with go-spiffe.
	westBundles, err := workloadapi.NewBundleSource(ctx, workloadapi.WithClientOptions(workloadapi.WithAddr(westAddr)))
	require.NoError(t, err)
	defer westBundles.Close()
	offline, err := jwtsvid.ParseAndValidate(token.Marshal(), westBundles, []string{"spiffe://west.example/ns/default/sa/web"})
	require.NoError(t, err, "east's JWT authorities reach west's BundleSource")
	assert.Equal(t, eastWorkload, offline.ID)
	eastJWT, err := westBundles.GetJWTBundleForTrustDomain(east.td)
	require.NoError(t, err)
	assert.NotEmpty(t, eastJWT.JWTAuthorities())
	_, err = westClient.ValidateJWTSVID(ctx, token.Marshal(), "spiffe://west.example/other")
	assert.Error(t, err, "for another audience it does not")

	// Both CAs rotate while every source is open; each workload sees its
	// own trust domain's new root and its peer's, and mTLS keeps working
	// all along.
	for _, s := range []*e2eServer{east, west} {
		_, stderr, code := runCLIAt(t, time.Now, "", "ca", "rotate", "--data-dir", s.dataDir)
		require.Equal(t, 0, code, stderr)
	}
	var mu sync.Mutex
	var handshakes int
	var failed []error
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		err := spiffetlsHello(ctx, ln.Addr().String(), west.td, eastSrc)
		mu.Lock()
		handshakes++
		if err != nil {
			failed = append(failed, err)
		}
		mu.Unlock()
		assert.Equal(c, 2, authorities(eastSrc, east.td), "east's own new root")
		assert.Equal(c, 2, authorities(eastSrc, west.td), "west's new root, federated")
		assert.Equal(c, 2, authorities(westSrc, west.td), "west's own new root")
		assert.Equal(c, 2, authorities(westSrc, east.td), "east's new root, federated")
	}, 2*time.Minute, 250*time.Millisecond, "the rotations reach both workloads' sources")
	require.NoError(t, spiffetlsHello(ctx, ln.Addr().String(), west.td, eastSrc))
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d mTLS exchanges during the rotations", handshakes)
	assert.Empty(t, failed, "every exchange during the rotations succeeds")
}

// serveWest answers on ln, as west's workload: HTTP over the spiffetls
// listener (which admits east's workloads only), validating the bearer
// JWT-SVID for url with west's agent; a line that is not HTTP is echoed.
func serveWest(t *testing.T, ln net.Listener, client *workloadapi.Client, url string) {
	t.Helper()
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		svid, err := client.ValidateJWTSVID(r.Context(), strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), url)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(w, "hello %s", svid.ID)
	})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
}

// spiffetlsHello dials addr with spiffetls as a workload of src,
// authorizing members of peer, and sends one HTTP request.
func spiffetlsHello(ctx context.Context, addr string, peer spiffeid.TrustDomain, src *workloadapi.X509Source) error {
	conn, err := spiffetls.DialWithMode(ctx, "tcp", addr, spiffetls.MTLSClientWithSource(tlsconfig.AuthorizeMemberOf(peer), src))
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: west\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// No bearer token: west's handler refuses the request, after the
	// mTLS handshake this checks.
	if resp.StatusCode != http.StatusUnauthorized {
		return fmt.Errorf("west answered %s", resp.Status)
	}
	return nil
}

// runExample runs docs/examples/workload-api, the README's program, with
// SPIFFE_ENDPOINT_SOCKET set to addr.
func runExample(t *testing.T, addr string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"run", "./docs/examples/workload-api"}, args...)...)
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "SPIFFE_ENDPOINT_SOCKET="+addr)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return string(out)
}
