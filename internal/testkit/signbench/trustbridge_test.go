package signbench

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/identityapi"
	"github.com/trustbridge/trustbridge/internal/testkit/proctest"
)

// binEnv names the trustbridge binary the trustbridge target runs; make
// bench and make unit set it to bin/trustbridge.
const binEnv = "TRUSTBRIDGE_BIN"

// flagsEnv names extra `trustbridge server` flags for the trustbridge
// target, split at spaces (e.g. "--sign-queue-size 10000"), to try the
// server's knobs under the same load without changing the benchmarks.
const flagsEnv = "SIGNBENCH_TRUSTBRIDGE_FLAGS"

var (
	benchTD = spiffeid.RequireTrustDomainFromString("example.org")
	// agentID is who every trustbridge client is: one node agent, which
	// got its X509-SVID with a reusable bootstrap token and from then on
	// authenticates by it, as an agent renewing and asking for its
	// workloads does.
	agentID = spiffeid.RequireFromPath(benchTD, "/bench/agent")
)

// bootstrapToken grants agentID; reusable, so that the SVID it buys
// stays granted (a renewal whose grant is gone is refused).
const bootstrapToken = "signbench-bootstrap-token-0123456789abcdef"

// trustbridgeTarget is `trustbridge server` (TRUSTBRIDGE_BIN) in a
// process of its own, at its default log level (info: a record per
// certificate, as in production), with its certificate service on
// loopback.
type trustbridgeTarget struct {
	pid    int
	addr   string // the certificate service, host:port
	bundle *spiffebundle.Bundle
	svid   tls.Certificate // agentID's X509-SVID, from the bootstrap token
}

// newTrustbridgeTarget starts a fresh server. trustbridge ships without
// a per-identity signing limit (--sign-rate-limit 0), so
// opts.SigningRateLimit changes nothing: the server as shipped is the
// unlimited one. Extra flags come from SIGNBENCH_TRUSTBRIDGE_FLAGS. It
// skips without TRUSTBRIDGE_BIN.
func newTrustbridgeTarget(tb testing.TB, opts targetOptions) target {
	tb.Helper()
	_ = opts // nothing to turn off: see the doc comment
	bin := os.Getenv(binEnv)
	if bin == "" {
		tb.Skipf("%s is unset: set it to a trustbridge binary (make build; bin/trustbridge), as make bench does", binEnv)
	}
	dir := tb.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, fmt.Appendf(nil, "%s,%s,reusable\n", bootstrapToken, agentID), 0o600); err != nil {
		tb.Fatal(err)
	}
	args := append([]string{"server",
		"--trust-domain", benchTD.Name(),
		"--data-dir", filepath.Join(dir, "data"), "--init",
		"--admin-listen", "127.0.0.1:0",
		"--grpc-listen", "127.0.0.1:0",
		"--bundle-listen", "",
		"--bootstrap-token-file", tokens,
		"--log-format", "json",
	}, strings.Fields(os.Getenv(flagsEnv))...)
	p := startServer(tb, bin, args)
	t := &trustbridgeTarget{pid: p.pid, addr: p.grpc, bundle: fetchBundle(tb, p.admin)}
	t.svid = t.bootstrap(tb)
	return t
}

func (t *trustbridgeTarget) Name() string { return "trustbridge" }

func (t *trustbridgeTarget) PID() int { return t.pid }

// CSR asks for agentID, the identity the clients authenticate as: the
// server signs a CSR only for the caller's own identity.
func (t *trustbridgeTarget) CSR(tb testing.TB, key *ecdsa.PrivateKey) []byte {
	tb.Helper()
	return agentCSR(tb, key)
}

// agentCSR is a CSR for agentID with key, DER.
func agentCSR(tb testing.TB, key *ecdsa.PrivateKey) []byte {
	tb.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{agentID.URL()}}, key)
	if err != nil {
		tb.Fatal(err)
	}
	return der
}

// Dial connects over mTLS with the agent's X509-SVID, verifying the
// server as spiffe://example.org/trustbridge/ca, as the agent does.
func (t *trustbridgeTarget) Dial(tb testing.TB) client {
	tb.Helper()
	c, err := dialClient(t.addr, caclient.ServerTLS(t.bundle.X509Authorities(), t.serverID(), &t.svid))
	if err != nil {
		tb.Fatalf("dial trustbridge at %s: %v", t.addr, err)
	}
	return c
}

func (t *trustbridgeTarget) serverID() spiffeid.ID {
	return spiffeid.RequireFromPath(benchTD, caclient.ServerPath)
}

// dialClient connects to the certificate service at addr as the agent
// does (caclient.Dial) and returns a client whose connection is ready:
// TLS and HTTP/2 set up. The floor target's clients are these too.
func dialClient(addr string, cfg *tls.Config) (*trustbridgeClient, error) {
	conn, err := caclient.Dial(addr, cfg, "")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := waitReady(ctx, conn); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return &trustbridgeClient{conn: conn,
		certs: securityv1alpha1.NewIstioCertificateServiceClient(conn), identity: identityapi.NewIdentityServiceClient(conn)}, nil
}

// waitReady connects conn and waits until it is ready; a failure to
// connect is not retried.
func waitReady(ctx context.Context, conn *grpc.ClientConn) error {
	conn.Connect()
	for {
		switch s := conn.GetState(); s {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure, connectivity.Shutdown:
			return fmt.Errorf("connection %s", s)
		default:
			if !conn.WaitForStateChange(ctx, s) {
				return fmt.Errorf("connection still %s: %w", s, ctx.Err())
			}
		}
	}
}

// bootstrap gets agentID's X509-SVID with the bootstrap token, once.
func (t *trustbridgeTarget) bootstrap(tb testing.TB) tls.Certificate {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	chain, err := caclient.CreateCertificate(ctx, t.addr, caclient.ServerTLS(t.bundle.X509Authorities(), t.serverID(), nil),
		caclient.Request{Key: key, ID: agentID, Token: bootstrapToken})
	if err != nil {
		tb.Fatalf("bootstrap %s with a token: %v", agentID, err)
	}
	chain = caclient.LeafChain(chain)
	cert := tls.Certificate{PrivateKey: key, Leaf: chain[0]}
	for _, c := range chain {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	return cert
}

// trustbridgeClient is one agent connection to the certificate service.
type trustbridgeClient struct {
	conn     *grpc.ClientConn
	certs    securityv1alpha1.IstioCertificateServiceClient
	identity identityapi.IdentityServiceClient
}

// X509 is Istio's CreateCertificate with the CSR in PEM, as Istio's
// agent and trustbridge's send it.
func (c *trustbridgeClient) X509(ctx context.Context, csr []byte) error {
	_, err := c.createCertificate(ctx, csr)
	return err
}

func (c *trustbridgeClient) createCertificate(ctx context.Context, csr []byte) (*securityv1alpha1.IstioCertificateResponse, error) {
	resp, err := c.certs.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{
		Csr: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr})),
	})
	if err != nil {
		return nil, err
	}
	// The leaf is parsed only in TestTrustbridgeTarget: under load the
	// client's CPU competes with the server's.
	if chain := resp.GetCertChain(); len(chain) == 0 || !strings.HasPrefix(chain[0], "-----BEGIN CERTIFICATE-----") {
		return nil, errors.New("trustbridge answered CreateCertificate without a PEM certificate chain")
	}
	return resp, nil
}

// JWT is the identity service's MintJWTSVID for the caller itself.
func (c *trustbridgeClient) JWT(ctx context.Context, audience string) error {
	_, err := c.mintJWT(ctx, audience)
	return err
}

func (c *trustbridgeClient) mintJWT(ctx context.Context, audience string) (*identityapi.MintJWTSVIDResponse, error) {
	resp, err := c.identity.MintJWTSVID(ctx, &identityapi.MintJWTSVIDRequest{Audience: []string{audience}})
	if err != nil {
		return nil, err
	}
	if resp.GetToken() == "" {
		return nil, errors.New("trustbridge answered MintJWTSVID without a token")
	}
	return resp, nil
}

func (c *trustbridgeClient) Close() error { return c.conn.Close() }

// DialBatched connects once, as Dial does, and returns n clients sharing
// that connection whose JWT-SVIDs go through one caclient.JWTBatcher, as
// a node agent mints for its workloads: n workloads of one node asking at
// once, their mints coalesced into MintJWTSVIDs calls. X509 calls are
// unary, as Dial's.
func (t *trustbridgeTarget) DialBatched(tb testing.TB, n int) []client {
	tb.Helper()
	c := t.Dial(tb).(*trustbridgeClient)
	shared := newBatchedClient(c, c.conn)
	clients := make([]client, n)
	for i := range clients {
		clients[i] = shared
	}
	return clients
}

// newBatchedClient is c minting through a JWTBatcher on conn (c's
// connection, or a test's wrapping of it), whose calls it counts.
func newBatchedClient(c *trustbridgeClient, conn grpc.ClientConnInterface) *batchedClient {
	calls := &countingConn{ClientConnInterface: conn}
	return &batchedClient{trustbridgeClient: c, batcher: caclient.NewJWTBatcher(calls), calls: calls}
}

// batchedClient is a trustbridgeClient minting through a JWTBatcher; its
// goroutines share it, and Close closes the connection once.
type batchedClient struct {
	*trustbridgeClient
	batcher *caclient.JWTBatcher
	// calls are the batcher's: a server that answered MintJWTSVIDs
	// Unimplemented would have it mint a token per MintJWTSVID call, and
	// the row measure unary calls under the batched row's name.
	calls *countingConn
	once  sync.Once
	err   error
}

// JWT mints a JWT-SVID of the caller for audience through the batcher.
// Once any token went by unary MintJWTSVID it fails, with an error that
// is no gRPC status, so that runLoad, and the row, fail.
func (c *batchedClient) JWT(ctx context.Context, audience string) error {
	svid, err := c.batcher.Mint(ctx, spiffeid.ID{}, []string{audience}, 0)
	if n := c.calls.count(identityapi.IdentityService_MintJWTSVID_FullMethodName); n > 0 {
		return fmt.Errorf("the batcher made %d unary MintJWTSVID calls: the server does not batch (MintJWTSVIDs Unimplemented?), so the %s row would measure a call per token", n, rowBatched)
	}
	if err != nil {
		return err
	}
	if svid.ID != agentID {
		return fmt.Errorf("trustbridge minted a JWT-SVID for %s, not %s", svid.ID, agentID)
	}
	return nil
}

func (c *batchedClient) Close() error {
	c.once.Do(func() { c.err = c.trustbridgeClient.Close() })
	return c.err
}

// countingConn counts the unary calls made on its connection by full
// method name, and the items of its MintJWTSVIDs calls: a client
// interceptor on the connection a JWTBatcher is given.
type countingConn struct {
	grpc.ClientConnInterface
	mu    sync.Mutex
	calls map[string]int
	items int // asked for by MintJWTSVIDs calls
}

func (c *countingConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	c.mu.Lock()
	if c.calls == nil {
		c.calls = map[string]int{}
	}
	c.calls[method]++
	if batch, ok := args.(*identityapi.MintJWTSVIDsRequest); ok {
		c.items += len(batch.GetRequests())
	}
	c.mu.Unlock()
	return c.ClientConnInterface.Invoke(ctx, method, args, reply, opts...)
}

// count is how many calls of method were made.
func (c *countingConn) count(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[method]
}

// batchedItems is how many tokens the MintJWTSVIDs calls asked for.
func (c *countingConn) batchedItems() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.items
}

// serverProcess is a started `trustbridge server` and its listeners.
type serverProcess struct {
	pid         int
	grpc, admin string
}

// startServer runs bin with args and waits for the start-up record that
// names its listeners; the server is stopped with SIGTERM when tb ends
// (killed, and tb failed, after 15 s). Its log is drained as it comes and
// not kept, but for its first 64 KiB, shown when it does not start: under
// load the log is part of the server's cost, not the client's.
//
// With SIGNBENCH_TRUSTBRIDGE_CGROUP set to a cgroup's directory (a memory
// cgroup with the limit of a pod, say), the server runs in it, and sets
// its Go runtime's memory limit from it as it does in a container.
func startServer(tb testing.TB, bin string, args []string) serverProcess {
	tb.Helper()
	cmd := exec.Command(bin, args...)
	if cg := os.Getenv("SIGNBENCH_TRUSTBRIDGE_CGROUP"); cg != "" {
		// exec keeps the process, so the pid is still the server's.
		cmd = exec.Command("/bin/sh", append([]string{"-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, cg, bin}, args...)...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // even when a -timeout panic skips cleanups
	stderr, err := cmd.StderrPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	head := &capped{max: 64 << 10}
	started := make(chan map[string]string, 1)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		readStart(io.TeeReader(stderr, head), started)
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
	}()
	proctest.StopOnCleanup(tb, cmd.Process, exited, "trustbridge server")
	select {
	case l := <-started:
		if l["grpc"] == "" || l["admin"] == "" {
			tb.Fatalf("trustbridge server started without a gRPC or admin listener: %v", l)
		}
		return serverProcess{pid: cmd.Process.Pid, grpc: l["grpc"], admin: l["admin"]}
	case <-exited:
		tb.Fatalf("trustbridge server %v exited before it started:\n%s", args, head.String())
	case <-time.After(time.Minute):
		tb.Fatalf("trustbridge server did not start within a minute:\n%s", head.String())
	}
	return serverProcess{}
}

// readStart reads JSON log records from r until "trustbridge server
// started", whose listeners it sends on started.
func readStart(r io.Reader, started chan<- map[string]string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec struct {
			Msg       string            `json:"msg"`
			Listeners map[string]string `json:"listeners"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "trustbridge server started" {
			started <- rec.Listeners
			return
		}
	}
}

// capped keeps the first max bytes written to it.
type capped struct {
	max int
	mu  sync.Mutex
	b   strings.Builder
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.max - c.b.Len(); room > 0 {
		c.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (c *capped) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.String()
}

// fetchBundle reads the trust domain's SPIFFE bundle (X.509 roots and
// JWT keys) from the admin listener's /v1/bundle.
func fetchBundle(tb testing.TB, admin string) *spiffebundle.Bundle {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/v1/bundle", nil)
	if err != nil {
		tb.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("/v1/bundle: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		tb.Fatalf("/v1/bundle: %s %v: %s", resp.Status, err, body)
	}
	b, err := spiffebundle.Parse(benchTD, body)
	if err != nil {
		tb.Fatalf("/v1/bundle: %v", err)
	}
	return b
}

// TestTrustbridgeTarget checks the trustbridge target and the harness on
// it: one X509-SVID and one JWT-SVID verified against the server's
// bundle, then runLoad and runBurst on a small scale, with some calls
// the server refuses, whose counts must add up. No timing is checked.
func TestTrustbridgeTarget(t *testing.T) {
	tgt := newTrustbridgeTarget(t, targetOptions{SigningRateLimit: true})
	tb := tgt.(*trustbridgeTarget)
	c := tgt.Dial(t).(*trustbridgeClient)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Run("x509", func(t *testing.T) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		resp, err := c.createCertificate(ctx, tgt.CSR(t, key))
		require.NoError(t, err)
		var chain []*x509.Certificate
		for _, p := range resp.GetCertChain() {
			certs, err := caclient.ParsePEMCerts([]byte(p))
			require.NoError(t, err)
			chain = append(chain, certs...)
		}
		id, _, err := x509svid.Verify(caclient.LeafChain(chain), tb.bundle)
		require.NoError(t, err, "the X509-SVID verifies against the server's bundle")
		assert.Equal(t, agentID, id)
		assert.True(t, key.PublicKey.Equal(chain[0].PublicKey), "the certificate is for the CSR's key")
	})
	t.Run("jwt", func(t *testing.T) {
		resp, err := c.mintJWT(ctx, jwtAudience)
		require.NoError(t, err)
		svid, err := jwtsvid.ParseAndValidate(resp.GetToken(), tb.bundle, []string{jwtAudience})
		require.NoError(t, err, "the JWT-SVID validates against the server's bundle")
		assert.Equal(t, agentID, svid.ID)
		_, err = jwtsvid.ParseAndValidate(resp.GetToken(), tb.bundle, []string{"https://other.example"})
		assert.Error(t, err, "not for another audience")
	})

	const calls, conns = 50, 5
	clients := make([]client, conns)
	for i := range clients {
		clients[i] = tgt.Dial(t)
	}
	t.Cleanup(func() { closeAll(clients) })
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	csr := tgt.CSR(t, key)
	// Every fifth call is one the server refuses (InvalidArgument).
	x509Call := func(ctx context.Context, c client, i int) error {
		if i%5 == 0 {
			return c.X509(ctx, []byte("not a CSR"))
		}
		return c.X509(ctx, csr)
	}
	jwtCall := func(ctx context.Context, c client, i int) error {
		if i%5 == 0 {
			return c.JWT(ctx, "")
		}
		return c.JWT(ctx, jwtAudience)
	}
	for _, run := range []struct {
		name string
		run  func(call) (load, error)
	}{
		{"load", func(do call) (load, error) { return runLoad(tgt.PID(), clients, calls, do) }},
		{"burst", func(do call) (load, error) { return runBurst(tgt.PID(), clients, calls, 100*time.Millisecond, do) }},
	} {
		for kind, do := range map[string]call{"x509": x509Call, "jwt": jwtCall} {
			t.Run(run.name+"/"+kind, func(t *testing.T) {
				l, err := run.run(do)
				require.NoError(t, err)
				assert.Equal(t, calls, l.calls)
				assert.Equal(t, calls*4/5, l.served)
				assert.Equal(t, map[codes.Code]int{codes.InvalidArgument: calls / 5}, l.refused)
				assert.Equal(t, calls/5, sumValues(l.reasons), "reasons %v", l.reasons)
				assert.Len(t, l.latencies, calls)
				assert.Equal(t, calls*4/5, countTrue(l.ok))
				assert.Positive(t, l.wall)
				assert.GreaterOrEqual(t, l.serverCPU, time.Duration(0))
				for i, d := range l.latencies {
					assert.Positive(t, d, "latency of call %d", i)
					assert.LessOrEqual(t, d, l.wall, "latency of call %d", i)
				}
			})
		}
	}
	// The trustbridge-batched row's clients: every token in a
	// MintJWTSVIDs call, none by unary MintJWTSVID.
	t.Run("batched", func(t *testing.T) {
		batched := tb.DialBatched(t, conns)
		t.Cleanup(func() { closeAll(batched) })
		l, err := runLoad(tgt.PID(), batched, calls, jwtCall)
		require.NoError(t, err)
		assert.Equal(t, calls*4/5, l.served)
		assert.Equal(t, map[codes.Code]int{codes.InvalidArgument: calls / 5}, l.refused, "each item judged on its own")
		counted := batched[0].(*batchedClient).calls
		assert.Zero(t, counted.count(identityapi.IdentityService_MintJWTSVID_FullMethodName))
		assert.Equal(t, calls, counted.batchedItems(), "every token asked for once, in a MintJWTSVIDs call")
		assert.Positive(t, counted.count(identityapi.IdentityService_MintJWTSVIDs_FullMethodName))
	})
	// A server answering MintJWTSVIDs Unimplemented (one that predates
	// it) has the batcher mint by MintJWTSVID: the row must fail, not
	// measure unary calls.
	t.Run("batched/unimplemented", func(t *testing.T) {
		c := tgt.Dial(t).(*trustbridgeClient)
		old := newBatchedClient(c, unbatchedConn{c.conn})
		t.Cleanup(func() { _ = old.Close() })
		err := old.JWT(ctx, jwtAudience)
		require.Error(t, err)
		assert.ErrorContains(t, err, "1 unary MintJWTSVID calls")
		_, isStatus := status.FromError(err)
		assert.False(t, isStatus, "not a refusal, which runLoad would count")
		assert.Equal(t, 1, old.calls.count(identityapi.IdentityService_MintJWTSVIDs_FullMethodName))
		_, err = runLoad(tgt.PID(), []client{old}, 5, jwtCall)
		assert.ErrorContains(t, err, "unary MintJWTSVID calls")
	})
	t.Run("memory", func(t *testing.T) {
		rss := mustStatusKiB(t, tgt.PID(), "VmRSS")
		peak := mustStatusKiB(t, tgt.PID(), "VmHWM")
		assert.Positive(t, rss)
		assert.GreaterOrEqual(t, peak, rss)
	})
}

// unbatchedConn answers MintJWTSVIDs Unimplemented, as a server that
// predates it does, and passes every other call on.
type unbatchedConn struct{ grpc.ClientConnInterface }

func (c unbatchedConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if method == identityapi.IdentityService_MintJWTSVIDs_FullMethodName {
		return status.Error(codes.Unimplemented, "unknown method MintJWTSVIDs")
	}
	return c.ClientConnInterface.Invoke(ctx, method, args, reply, opts...)
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}
