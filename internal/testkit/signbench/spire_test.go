package signbench

// The SPIRE side of issue 40: spire-server 1.13.3 (bin/spire, run by
// internal/testkit/spiretest) as a target, its certificates asked for the
// way a node agent asks for them.
//
// Which path, and why it is the fair equivalent of trustbridge's: a
// trustbridge node agent (or Istio's agent) holds a credential of its own
// and asks the CA over gRPC/mTLS for one workload certificate per call.
// SPIRE's counterpart is the agent-facing SVID API on the server's TCP
// listener, which is what spire-agent itself calls: BatchNewX509SVID and
// NewJWTSVID (pkg/server/api/svid/v1/service.go), authenticated by the
// agent's X509-SVID. The target plays a spire-agent without running one:
// it attests a synthetic agent itself with a join token (Agent API
// AttestAgent, join_token, a CSR for its own key), registers one
// workload entry parented to that agent, and waits, before any clock
// starts, until the server's entry cache authorizes the entry. Each
// client then dials the TCP listener with mTLS as that agent; X509 is
// BatchNewX509SVID with one param {entry_id, CSR} (one certificate per
// call, as trustbridge's path signs one per call), JWT is NewJWTSVID
// {entry_id, audience}.
//
// What SPIRE does per call on that path (1.13.3, read in
// pkg/server/endpoints/middleware.go and pkg/server/api/middleware):
//   - authorization: the OPA/Rego policy engine is evaluated for every
//     RPC (allow_agent for these two); then the agent is checked against
//     its attested node record. With max_attested_node_info_staleness
//     unset (the default, kept here) the node cache is off, so that is a
//     datastore read (FetchAttestedNode) per call; the datastore here is
//     SQLite on local disk, cheaper than the networked SQL a deployment
//     has. The entry itself is looked up in the in-memory authorized
//     entry cache.
//   - rate limit: ratelimit.signing (on by default) puts a per-IP token
//     bucket of 500 a second, burst 500, in front of BatchNewX509SVID
//     (counted per param) and another in front of NewJWTSVID. It waits
//     (golang.org/x/time/rate WaitN) rather than refuses, except a batch
//     over 500 params, or a call whose deadline would pass before its
//     turn, which are refused at once (code Unknown). All clients here
//     come from 127.0.0.1, so they share one bucket, as agents behind one
//     NAT address would; in a deployment each node's agent has an
//     address, and a bucket, of its own. "spire" keeps the limit,
//     "spire-unlimited" sets signing = false.
//   - signing: the CSR's signature is checked and only its public key is
//     used; the SPIFFE ID, DNS names and TTL come from the entry. The
//     server CA's key is in memory (KeyManager "memory").
//
// Not chosen: the admin RPCs MintX509SVID and MintJWTSVID. They have no
// rate limit at all (NoLimit in RateLimits, whatever ratelimit.signing
// says), take the SPIFFE ID from the CSR or the request rather than from
// a registration entry, and authorize the caller as an admin through a
// datastore query for the caller's entries (ListRegistrationEntries by
// SPIFFE ID) on every call, or from the local admin socket without
// authentication. No agent uses them to get a workload's certificate, so
// they would measure a different thing; newSPIREAdminMintTarget runs
// them anyway, as the "spire-admin-mint" row, over TCP with an admin
// SVID (an entry with admin = true), for whoever wants that row.
//
// The server logs at INFO, as SPIRE ships (the kit's DEBUG logs a line
// per certificate).

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	agentv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/agent/v1"
	svidv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/svid/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/internal/testkit/spiretest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func init() { spireTarget = newSPIRETarget }

const (
	spireTrustDomain = "spire.example"
	// spireSetupTimeout bounds each step of setting a target up (attesting,
	// dialing, waiting for the entry cache), none of which is timed.
	spireSetupTimeout = 30 * time.Second
	// spireRetryInterval is how often setup asks again whether a new entry
	// is authorized: SPIRE offers no signal for it, and reloads its entry
	// cache every second in the kit's configuration.
	spireRetryInterval = 100 * time.Millisecond
)

// spire is a spire-server with a synthetic agent attested to it and one
// workload entry parented to that agent.
type spire struct {
	name     string
	server   *spiretest.Server
	bundle   *spiffebundle.Bundle // the server's own, from bundle show
	serverID spiffeid.ID          // what the server's TLS certificate names
	agent    *x509svid.SVID       // the synthetic agent's SVID and key
	workload spiffeid.ID
	entryID  string
	// caller is the credential Dial presents: the agent's SVID, or an
	// admin's for the admin mint RPCs.
	caller *x509svid.SVID
	// mint makes the clients call MintX509SVID and MintJWTSVID.
	mint bool
}

// newSPIRETarget starts spire-server, attests a synthetic agent and
// registers a workload under it; its clients ask for the workload's
// SVIDs as that agent (BatchNewX509SVID, NewJWTSVID).
func newSPIRETarget(tb testing.TB, opts targetOptions) target {
	tb.Helper()
	name := "spire"
	if !opts.SigningRateLimit {
		name = "spire-unlimited"
	}
	return startSPIRE(tb, name, opts)
}

// newSPIREAdminMintTarget is newSPIRETarget whose clients are an admin
// workload calling MintX509SVID and MintJWTSVID, which SPIRE never rate
// limits (opts changes nothing for them).
func newSPIREAdminMintTarget(tb testing.TB, opts targetOptions) target {
	tb.Helper()
	s := startSPIRE(tb, "spire-admin-mint", opts)
	adminID := spiffeid.RequireFromPath(s.workload.TrustDomain(), "/signbench/admin")
	entryID := s.server.CreateEntry(tb, spiretest.Entry{
		ParentID: s.agent.ID.String(), SPIFFEID: adminID.String(),
		Selectors: []string{spiretest.UIDSelector(os.Getuid())}, Admin: true,
	})
	s.caller = s.awaitSVID(tb, entryID, adminID)
	s.mint = true
	return s
}

func startSPIRE(tb testing.TB, name string, opts targetOptions) *spire {
	tb.Helper()
	srv := spiretest.Start(tb, spiretest.Config{
		TrustDomain: spireTrustDomain, NoSigningRateLimit: !opts.SigningRateLimit, LogLevel: "INFO",
	})
	td := spiffeid.RequireTrustDomainFromString(spireTrustDomain)
	s := &spire{
		name:     name,
		server:   srv,
		bundle:   spireBundle(tb, srv),
		serverID: spiffeid.RequireFromPath(td, "/spire/server"),
		workload: spiffeid.RequireFromPath(td, "/signbench/workload"),
	}
	s.agent = s.attest(tb)
	s.entryID = srv.CreateEntry(tb, spiretest.Entry{
		ParentID: s.agent.ID.String(), SPIFFEID: s.workload.String(),
		Selectors: []string{spiretest.UIDSelector(os.Getuid())},
	})
	s.caller = s.agent
	s.awaitSVID(tb, s.entryID, s.workload)
	return s
}

// spireBundle is the server's own bundle, X.509 and JWT authorities.
func spireBundle(tb testing.TB, srv *spiretest.Server) *spiffebundle.Bundle {
	tb.Helper()
	doc, err := srv.LocalBundleDoc()
	require.NoError(tb, err)
	b, err := spiffebundle.Parse(spiffeid.RequireTrustDomainFromString(srv.TrustDomain()), doc)
	require.NoError(tb, err, "spire: bundle show -format spiffe")
	return b
}

// attest does what spire-agent does at its first start: AttestAgent with
// a join token and a CSR for a fresh key, over TLS without a client
// certificate, and returns the agent's SVID.
func (s *spire) attest(tb testing.TB) *x509svid.SVID {
	tb.Helper()
	token, agentID := s.server.JoinToken(tb)
	key := newSPIREKey(tb)
	csr, err := spireCSR(key, spiffeid.ID{}) // spire-agent's has no URI SAN either
	require.NoError(tb, err)
	ctx, cancel := context.WithTimeout(context.Background(), spireSetupTimeout)
	defer cancel()
	conn, err := s.dial(ctx, tlsconfig.TLSClientConfig(s.bundle, tlsconfig.AuthorizeID(s.serverID)))
	require.NoError(tb, err)
	defer conn.Close()
	chain, err := attestJoinToken(ctx, agentv1.NewAgentClient(conn), token, csr)
	require.NoError(tb, err)
	svid, err := spireSVID(chain, key, s.bundle, spiffeid.RequireFromString(agentID))
	require.NoError(tb, err, "spire: agent SVID")
	return svid
}

// attestJoinToken runs AttestAgent's one step for join_token, which has
// no challenge, and returns the agent's certificate chain.
func attestJoinToken(ctx context.Context, c agentv1.AgentClient, token string, csr []byte) ([][]byte, error) {
	stream, err := c.AttestAgent(ctx)
	if err != nil {
		return nil, fmt.Errorf("spire: AttestAgent: %w", err)
	}
	err = stream.Send(&agentv1.AttestAgentRequest{Step: &agentv1.AttestAgentRequest_Params_{
		Params: &agentv1.AttestAgentRequest_Params{
			Data:   &types.AttestationData{Type: "join_token", Payload: []byte(token)},
			Params: &agentv1.AgentX509SVIDParams{Csr: csr},
		},
	}})
	if err != nil {
		return nil, fmt.Errorf("spire: AttestAgent: send: %w", err)
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("spire: AttestAgent: %w", err)
	}
	_ = stream.CloseSend()
	return svidChain(resp.GetResult().GetSvid())
}

// awaitSVID asks, as the agent, for an X509-SVID of entryID until the
// server's entry cache authorizes it (NotFound until then), and returns
// the SVID, which it checks names id.
func (s *spire) awaitSVID(tb testing.TB, entryID string, id spiffeid.ID) *x509svid.SVID {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), spireSetupTimeout)
	defer cancel()
	conn, err := s.dial(ctx, tlsconfig.MTLSClientConfig(s.agent, s.bundle, tlsconfig.AuthorizeID(s.serverID)))
	require.NoError(tb, err)
	defer conn.Close()
	c := &spireClient{svid: svidv1.NewSVIDClient(conn), entryID: entryID}
	key := newSPIREKey(tb)
	csr, err := spireCSR(key, id)
	require.NoError(tb, err)
	var chain [][]byte
	err = retryNotFound(ctx, spireRetryInterval, func() error {
		var err error
		chain, err = c.x509SVID(ctx, csr)
		return err
	})
	require.NoError(tb, err, "spire: entry %s (%s) not authorized for agent %s", entryID, id, s.agent.ID)
	svid, err := spireSVID(chain, key, s.bundle, id)
	require.NoError(tb, err)
	return svid
}

// retryNotFound calls call until it returns something other than a
// NotFound status, every interval, for as long as ctx lasts.
func retryNotFound(ctx context.Context, interval time.Duration, call func() error) error {
	for {
		err := call()
		if status.Code(err) != codes.NotFound {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last answer: %w)", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}

// dial opens a gRPC connection of its own to the server's TCP listener
// and returns once it is ready, the TLS handshake done.
func (s *spire) dial(ctx context.Context, conf *tls.Config) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("passthrough:///"+s.server.Addr(), grpc.WithTransportCredentials(credentials.NewTLS(conf)))
	if err != nil {
		return nil, fmt.Errorf("spire: dial %s: %w", s.server.Addr(), err)
	}
	if err := awaitReady(ctx, conn); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("spire: dial %s: %w", s.server.Addr(), err)
	}
	return conn, nil
}

// awaitReady connects conn and waits until it is ready; a failed attempt
// (refused, or a TLS handshake that failed) is an error, not retried.
func awaitReady(ctx context.Context, conn *grpc.ClientConn) error {
	conn.Connect()
	for {
		switch st := conn.GetState(); st {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure, connectivity.Shutdown:
			return fmt.Errorf("connection %s (connect or TLS handshake failed: check the server's bundle and the client's SVID)", st)
		default:
			if !conn.WaitForStateChange(ctx, st) {
				return fmt.Errorf("connection still %s: %w", st, ctx.Err())
			}
		}
	}
}

func (s *spire) Name() string { return s.name }

func (s *spire) PID() int { return s.server.PID() }

// CSR is what spire-agent sends for a workload: the key and the
// workload's SPIFFE ID as URI SAN (SPIRE uses only the key and takes the
// ID from the entry, except MintX509SVID, which takes it from the CSR).
func (s *spire) CSR(tb testing.TB, key *ecdsa.PrivateKey) []byte {
	tb.Helper()
	csr, err := spireCSR(key, s.workload)
	require.NoError(tb, err)
	return csr
}

// Dial opens a client on a connection of its own, authenticated as the
// target's caller (the agent, or the admin workload).
func (s *spire) Dial(tb testing.TB) client {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), spireSetupTimeout)
	defer cancel()
	conn, err := s.dial(ctx, tlsconfig.MTLSClientConfig(s.caller, s.bundle, tlsconfig.AuthorizeID(s.serverID)))
	require.NoError(tb, err)
	return &spireClient{
		conn: conn, svid: svidv1.NewSVIDClient(conn), entryID: s.entryID,
		workload: &types.SPIFFEID{TrustDomain: s.workload.TrustDomain().Name(), Path: s.workload.Path()},
		mint:     s.mint,
	}
}

// spireClient asks SPIRE's SVID API for the workload's SVIDs.
type spireClient struct {
	conn     *grpc.ClientConn
	svid     svidv1.SVIDClient
	entryID  string
	workload *types.SPIFFEID // for MintJWTSVID
	mint     bool
}

func (c *spireClient) X509(ctx context.Context, csr []byte) error {
	_, err := c.x509SVID(ctx, csr)
	return err
}

func (c *spireClient) JWT(ctx context.Context, audience string) error {
	_, err := c.jwtSVID(ctx, audience)
	return err
}

func (c *spireClient) Close() error { return c.conn.Close() }

// x509SVID asks for one X509-SVID for csr and returns its chain, DER.
func (c *spireClient) x509SVID(ctx context.Context, csr []byte) ([][]byte, error) {
	if c.mint {
		resp, err := c.svid.MintX509SVID(ctx, &svidv1.MintX509SVIDRequest{Csr: csr})
		if err != nil {
			return nil, err
		}
		return svidChain(resp.GetSvid())
	}
	resp, err := c.svid.BatchNewX509SVID(ctx, &svidv1.BatchNewX509SVIDRequest{
		Params: []*svidv1.NewX509SVIDParams{{EntryId: c.entryID, Csr: csr}},
	})
	if err != nil {
		return nil, err
	}
	return batchResult(resp)
}

// batchResult is the chain of a one-param BatchNewX509SVID answer, or
// the param's status as a gRPC status error: the call as a whole
// succeeds even when SPIRE refuses the param.
func batchResult(resp *svidv1.BatchNewX509SVIDResponse) ([][]byte, error) {
	results := resp.GetResults()
	if len(results) != 1 {
		return nil, fmt.Errorf("spire: BatchNewX509SVID: %d results for one param", len(results))
	}
	st := results[0].GetStatus()
	if st == nil {
		return nil, errors.New("spire: BatchNewX509SVID: result without a status")
	}
	if code := codes.Code(st.GetCode()); code != codes.OK {
		return nil, status.Error(code, st.GetMessage())
	}
	return svidChain(results[0].GetSvid())
}

// svidChain is svid's certificate chain, which must not be empty.
func svidChain(svid *types.X509SVID) ([][]byte, error) {
	if len(svid.GetCertChain()) == 0 {
		return nil, errors.New("spire: answer without a certificate")
	}
	return svid.GetCertChain(), nil
}

// jwtSVID asks for one JWT-SVID for audience and returns the token.
func (c *spireClient) jwtSVID(ctx context.Context, audience string) (string, error) {
	var svid *types.JWTSVID
	if c.mint {
		resp, err := c.svid.MintJWTSVID(ctx, &svidv1.MintJWTSVIDRequest{Id: c.workload, Audience: []string{audience}})
		if err != nil {
			return "", err
		}
		svid = resp.GetSvid()
	} else {
		resp, err := c.svid.NewJWTSVID(ctx, &svidv1.NewJWTSVIDRequest{EntryId: c.entryID, Audience: []string{audience}})
		if err != nil {
			return "", err
		}
		svid = resp.GetSvid()
	}
	if svid.GetToken() == "" {
		return "", errors.New("spire: answer without a token")
	}
	return svid.GetToken(), nil
}

func newSPIREKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	return key
}

// spireCSR is a CSR for key naming id as its URI SAN (none if id is
// zero), with spire-agent's subject.
func spireCSR(key crypto.Signer, id spiffeid.ID) ([]byte, error) {
	tmpl := &x509.CertificateRequest{}
	tmpl.Subject.Country = []string{"US"}
	tmpl.Subject.Organization = []string{"SPIRE"}
	if !id.IsZero() {
		tmpl.URIs = append(tmpl.URIs, id.URL())
	}
	return x509.CreateCertificateRequest(rand.Reader, tmpl, key)
}

// spireSVID checks that chain is an X509-SVID for want verified by
// bundle, for key, and returns it with key.
func spireSVID(chain [][]byte, key crypto.Signer, bundle x509bundle.Source, want spiffeid.ID) (*x509svid.SVID, error) {
	id, _, err := x509svid.ParseAndVerify(chain, bundle)
	if err != nil {
		return nil, err
	}
	if id != want {
		return nil, fmt.Errorf("X509-SVID for %s, want %s", id, want)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	var certs []byte
	for _, der := range chain {
		certs = append(certs, der...)
	}
	return x509svid.ParseRaw(certs, keyDER) // checks the leaf is for key
}

// TestSPIRETarget: the SPIRE targets as the benchmarks use them, with the
// signing rate limit as SPIRE ships it and without, and through the
// admin mint RPCs: one X509-SVID (verified against the server's bundle,
// for the CSR's key) and one JWT-SVID (verified, for the audience); the
// rate limit there or not as configured; refusals come back as gRPC
// status errors.
func TestSPIRETarget(t *testing.T) {
	for _, tc := range []struct {
		name       string
		newTarget  newTarget
		opts       targetOptions
		limitBatch bool // a batch over the burst (500) is refused
	}{
		{"spire", newSPIRETarget, targetOptions{SigningRateLimit: true}, true},
		{"spire-unlimited", newSPIRETarget, targetOptions{SigningRateLimit: false}, false},
		{"spire-admin-mint", newSPIREAdminMintTarget, targetOptions{SigningRateLimit: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.newTarget(t, tc.opts).(*spire)
			assert.Equal(t, tc.name, s.Name())
			_, err := os.Stat("/proc/" + strconv.Itoa(s.PID()))
			assert.NoError(t, err, "server pid %d", s.PID())

			c := s.Dial(t).(*spireClient)
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), spireSetupTimeout)
			defer cancel()
			checkSPIRESVIDs(ctx, t, s, c)
			checkSPIRERefusals(ctx, t, s, c)
			checkSPIRELimit(ctx, t, s, tc.limitBatch)
		})
	}
}

func checkSPIRESVIDs(ctx context.Context, t *testing.T, s *spire, c *spireClient) {
	key := newSPIREKey(t)
	require.NoError(t, c.X509(ctx, s.CSR(t, key)))
	chain, err := c.x509SVID(ctx, s.CSR(t, key))
	require.NoError(t, err)
	_, err = spireSVID(chain, key, s.bundle, s.workload)
	assert.NoError(t, err)

	const audience = "signbench.example"
	require.NoError(t, c.JWT(ctx, audience))
	token, err := c.jwtSVID(ctx, audience)
	require.NoError(t, err)
	svid, err := jwtsvid.ParseAndValidate(token, s.bundle, []string{audience})
	require.NoError(t, err)
	assert.Equal(t, s.workload, svid.ID)
	assert.Equal(t, []string{audience}, svid.Audience)
}

// checkSPIRERefusals: what SPIRE refuses comes back as a gRPC status
// error with SPIRE's code, including a refused param of a batch.
func checkSPIRERefusals(ctx context.Context, t *testing.T, s *spire, c *spireClient) {
	assert.Equal(t, codes.InvalidArgument, status.Code(c.X509(ctx, []byte("not a CSR"))), "malformed CSR")
	if s.mint {
		other := *c
		other.workload = &types.SPIFFEID{TrustDomain: "elsewhere.example", Path: "/w"}
		assert.Equal(t, codes.InvalidArgument, status.Code(other.JWT(ctx, "a")), "foreign SPIFFE ID")
		return
	}
	other := *c
	other.entryID = "not-an-entry"
	key := newSPIREKey(t)
	assert.Equal(t, codes.NotFound, status.Code(other.X509(ctx, s.CSR(t, key))), "unknown entry")
	assert.Equal(t, codes.NotFound, status.Code(other.JWT(ctx, "a")), "unknown entry")

	// A client trusting other roots for the same trust domain does not
	// get a connection.
	foreign := testca.New(t, spireTrustDomain).Bundle()
	_, err := s.dial(ctx, tlsconfig.MTLSClientConfig(s.agent, foreign, tlsconfig.AuthorizeID(s.serverID)))
	assert.ErrorContains(t, err, "TLS handshake failed")
}

// checkSPIRELimit asks, as the agent, for 501 X509-SVIDs in one batch:
// over the limiter's burst of 500, SPIRE refuses it at once when the
// signing rate limit is on, and signs them all when it is off. The
// admin mint RPCs take no batch, and are never limited.
func checkSPIRELimit(ctx context.Context, t *testing.T, s *spire, limited bool) {
	if s.mint {
		return
	}
	conn, err := s.dial(ctx, tlsconfig.MTLSClientConfig(s.agent, s.bundle, tlsconfig.AuthorizeID(s.serverID)))
	require.NoError(t, err)
	defer conn.Close()
	csr := s.CSR(t, newSPIREKey(t))
	params := make([]*svidv1.NewX509SVIDParams, 501)
	for i := range params {
		params[i] = &svidv1.NewX509SVIDParams{EntryId: s.entryID, Csr: csr}
	}
	resp, err := svidv1.NewSVIDClient(conn).BatchNewX509SVID(ctx, &svidv1.BatchNewX509SVIDRequest{Params: params})
	if limited {
		assert.ErrorContains(t, err, "rate limiting")
		return
	}
	require.NoError(t, err)
	require.Len(t, resp.GetResults(), len(params))
	for i, r := range resp.GetResults() {
		if !assert.Equal(t, int32(codes.OK), r.GetStatus().GetCode(), "param %d: %s", i, r.GetStatus().GetMessage()) {
			break
		}
	}
}

func TestSPIREBatchResult(t *testing.T) {
	ok := &types.Status{Code: int32(codes.OK)}
	svid := &types.X509SVID{CertChain: [][]byte{{1}}}
	result := func(st *types.Status, svid *types.X509SVID) *svidv1.BatchNewX509SVIDResponse {
		return &svidv1.BatchNewX509SVIDResponse{Results: []*svidv1.BatchNewX509SVIDResponse_Result{{Status: st, Svid: svid}}}
	}
	for _, tc := range []struct {
		name string
		resp *svidv1.BatchNewX509SVIDResponse
		code codes.Code
		err  string
	}{
		{"signed", result(ok, svid), codes.OK, ""},
		{"refused", result(&types.Status{Code: int32(codes.NotFound), Message: "entry not found or not authorized"}, nil), codes.NotFound, "entry not found"},
		{"no status", result(nil, svid), codes.Unknown, "without a status"},
		{"no certificate", result(ok, &types.X509SVID{}), codes.Unknown, "without a certificate"},
		{"no result", &svidv1.BatchNewX509SVIDResponse{}, codes.Unknown, "0 results"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chain, err := batchResult(tc.resp)
			if tc.err == "" {
				assert.NoError(t, err)
				assert.Equal(t, svid.CertChain, chain)
				return
			}
			assert.ErrorContains(t, err, tc.err)
			assert.Equal(t, tc.code, status.Code(err))
		})
	}
}

func TestSPIRERetryNotFound(t *testing.T) {
	notFound := status.Error(codes.NotFound, "entry not found or not authorized")
	t.Run("until authorized", func(t *testing.T) {
		calls := 0
		err := retryNotFound(context.Background(), 0, func() error {
			calls++
			if calls < 3 {
				return notFound
			}
			return nil
		})
		assert.NoError(t, err)
		assert.Equal(t, 3, calls)
	})
	t.Run("other errors at once", func(t *testing.T) {
		calls := 0
		denied := status.Error(codes.PermissionDenied, "no")
		err := retryNotFound(context.Background(), 0, func() error { calls++; return denied })
		assert.ErrorIs(t, err, denied)
		assert.Equal(t, 1, calls)
	})
	t.Run("bounded", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := retryNotFound(ctx, time.Hour, func() error { return notFound })
		assert.ErrorIs(t, err, context.Canceled)
		assert.ErrorContains(t, err, "entry not found")
	})
}
