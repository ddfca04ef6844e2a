package agent

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	spiffejwt "github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/identityapi"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/sds"
)

// fakeIdentity is the server's IdentityService: WatchBundles streams the
// bundle map set last, MintJWTSVID signs for the workload.
type fakeIdentity struct {
	identityapi.UnimplementedIdentityServiceServer
	key   crypto.Signer
	kid   string
	mints atomic.Int32
	// ends ends the open WatchBundles streams with the error sent; while
	// refuse is set a new one ends at once, Unauthenticated.
	ends   chan error
	refuse atomic.Bool

	mu      sync.Mutex
	cur     *identityapi.WatchBundlesResponse
	changed chan struct{}
	// issuer is the jwt_issuer set sends.
	issuer string
}

func newFakeIdentity(t *testing.T) *fakeIdentity {
	return &fakeIdentity{key: testca.NewKey(t, testca.ECP256), kid: "jwt-a", changed: make(chan struct{}), ends: make(chan error)}
}

// set publishes bundles (and withheld trust domains) to every watcher.
func (f *fakeIdentity) set(t *testing.T, bundles []*spiffebundle.Bundle, withheld ...string) {
	t.Helper()
	doc, err := bundledoc.MarshalMap(bundles)
	require.NoError(t, err)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cur = &identityapi.WatchBundlesResponse{BundleMap: doc, WithheldTrustDomains: withheld, JwtIssuer: f.issuer}
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeIdentity) WatchBundles(_ *identityapi.WatchBundlesRequest, st grpc.ServerStreamingServer[identityapi.WatchBundlesResponse]) error {
	if f.refuse.Load() {
		return status.Error(codes.Unauthenticated, "certificate expired")
	}
	for {
		f.mu.Lock()
		cur, changed := f.cur, f.changed
		f.mu.Unlock()
		if cur != nil {
			if err := st.Send(cur); err != nil {
				return err
			}
		}
		select {
		case <-st.Context().Done():
			return nil
		case err := <-f.ends:
			return err
		case <-changed:
		}
	}
}

func (f *fakeIdentity) MintJWTSVID(_ context.Context, req *identityapi.MintJWTSVIDRequest) (*identityapi.MintJWTSVIDResponse, error) {
	f.mints.Add(1)
	now := time.Now()
	exp := now.Add(5 * time.Minute)
	tok, err := jwtsvid.Mint(f.key, f.kid, jwtsvid.Claims{Subject: workload, Audience: req.GetAudience(), IssuedAt: now, Expiry: exp})
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &identityapi.MintJWTSVIDResponse{Token: tok, SpiffeId: workload.String(), ExpiresAt: exp.Unix()}, nil
}

// newIdentityUpstream is the server's gRPC listener with mTLS, serving
// SDS (for the relay) and the IdentityService.
func newIdentityUpstream(t *testing.T, ca *testca.CA, trust *sds.TrustCell, id *fakeIdentity) *upstream {
	t.Helper()
	leaf, key := ca.Issue(t, serverID)
	srv, err := sds.New(sds.Config{
		TrustDomain:   ca.TrustDomain,
		Trust:         trust,
		Authenticator: authnFor(ca),
	})
	require.NoError(t, err)
	u := &upstream{ca: ca, trust: trust, tls: upstreamTLS(leaf, key)}
	u.gs = grpc.NewServer(grpc.Creds(credentials.NewTLS(u.tls)))
	srv.Register(u.gs)
	identityapi.RegisterIdentityServiceServer(u.gs, id)
	u.start(t, "")
	return u
}

// syncBuffer is a log sink the agent's goroutines write while the test
// reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func sourceOpts(path string) workloadapi.SourceOption {
	return workloadapi.WithClientOptions(workloadapi.WithAddr(endpointSocket(path)))
}

func TestWorkloadAPIWithCA(t *testing.T) {
	dir := shortDir(t)
	sock, wlSock := filepath.Join(dir, "socket"), filepath.Join(dir, "wl.sock")
	caA, caB := testca.New(t, tdA.Name()), testca.New(t, tdB.Name())
	trust := sds.NewTrustCell()
	require.NoError(t, trust.Set([]*x509bundle.Bundle{bundleOf(caA)}))
	ident := newFakeIdentity(t)
	ownBundle := caA.Bundle()
	require.NoError(t, ownBundle.AddJWTAuthority(ident.kid, ident.key.Public()))
	ident.set(t, []*spiffebundle.Bundle{ownBundle, caB.Bundle()})
	up := newIdentityUpstream(t, caA, trust, ident)

	var logs syncBuffer
	reg := prometheus.NewRegistry()
	a := caAgent(t, sock, newFakeRotator(t, caA, workload), up.addr, reg)
	a.log = slog.New(slog.NewTextHandler(&logs, nil))
	a.wlSocket = wlSock
	_, done := runAgent(t, a)
	waitSocket(t, wlSock, done)
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Contains(c, logs.String(), "SPIFFE_ENDPOINT_SOCKET=unix://"+wlSock)
	}, 5*time.Second, 5*time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	x509src, err := workloadapi.NewX509Source(ctx, sourceOpts(wlSock))
	require.NoError(t, err)
	defer x509src.Close()
	bundles, err := workloadapi.NewBundleSource(ctx, sourceOpts(wlSock))
	require.NoError(t, err)
	defer bundles.Close()
	svid, err := x509src.GetX509SVID()
	require.NoError(t, err)
	assert.Equal(t, workload, svid.ID)
	hasTD := func(td spiffeid.TrustDomain, root *x509.Certificate) func(*assert.CollectT) {
		return func(c *assert.CollectT) {
			b, err := bundles.GetX509BundleForTrustDomain(td)
			if assert.NoError(c, err) {
				assert.True(c, b.HasX509Authority(root))
			}
		}
	}
	assert.EventuallyWithT(t, hasTD(tdB, caB.Cert), 5*time.Second, 5*time.Millisecond)

	t.Run("a federated bundle change reaches the BundleSource", func(t *testing.T) {
		caB2 := testca.New(t, tdB.Name())
		b := caB.Bundle()
		b.AddX509Authority(caB2.Cert)
		ident.set(t, []*spiffebundle.Bundle{ownBundle, b})
		assert.EventuallyWithT(t, hasTD(tdB, caB2.Cert), 5*time.Second, 5*time.Millisecond)
	})

	t.Run("a withheld trust domain is withdrawn at once and logged", func(t *testing.T) {
		ident.set(t, []*spiffebundle.Bundle{ownBundle}, tdB.Name())
		assert.EventuallyWithT(t, func(c *assert.CollectT) {
			_, err := bundles.GetBundleForTrustDomain(tdB)
			assert.Error(c, err)
			assert.Contains(c, logs.String(), "trust_domain=b.test")
		}, 5*time.Second, 5*time.Millisecond)
	})

	t.Run("JWT-SVIDs are minted upstream and cached per audience set", func(t *testing.T) {
		jwtsrc, err := workloadapi.NewJWTSource(ctx, sourceOpts(wlSock))
		require.NoError(t, err)
		defer jwtsrc.Close()
		before := ident.mints.Load()
		first, err := jwtsrc.FetchJWTSVID(ctx, spiffejwt.Params{Audience: "x", ExtraAudiences: []string{"y"}})
		require.NoError(t, err)
		again, err := jwtsrc.FetchJWTSVID(ctx, spiffejwt.Params{Audience: "y", ExtraAudiences: []string{"x"}})
		require.NoError(t, err)
		assert.Equal(t, first.Marshal(), again.Marshal())
		assert.Equal(t, before+1, ident.mints.Load())
		_, err = spiffejwt.ParseAndValidate(first.Marshal(), jwtsrc, []string{"x"})
		assert.NoError(t, err, "the local JWT authorities from WatchBundles validate it")
	})

	t.Run("ValidateJWTSVID refuses a token of ours from another issuer", func(t *testing.T) {
		c, err := workloadapi.New(ctx, workloadapi.WithAddr(endpointSocket(wlSock)))
		require.NoError(t, err)
		defer c.Close()
		mint := func(iss string) string {
			now := time.Now()
			tok, err := jwtsvid.Mint(ident.key, ident.kid, jwtsvid.Claims{Issuer: iss, Subject: workload, Audience: []string{"svc"}, IssuedAt: now, Expiry: now.Add(time.Minute)})
			require.NoError(t, err)
			return tok
		}
		_, err = c.ValidateJWTSVID(ctx, mint("https://elsewhere.example"), "svc")
		require.NoError(t, err, "no issuer named by the server: iss is not checked")

		ident.mu.Lock()
		ident.issuer = "https://oidc.a.test"
		ident.mu.Unlock()
		ident.set(t, []*spiffebundle.Bundle{ownBundle}, tdB.Name()) // as the previous subtest left it
		assert.EventuallyWithT(t, func(c2 *assert.CollectT) {
			_, err := c.ValidateJWTSVID(ctx, mint("https://elsewhere.example"), "svc")
			assert.ErrorContains(c2, err, `is not a.test's issuer "https://oidc.a.test"`)
		}, 5*time.Second, 5*time.Millisecond)
		_, err = c.ValidateJWTSVID(ctx, mint("https://oidc.a.test"), "svc")
		assert.NoError(t, err)
		_, err = c.ValidateJWTSVID(ctx, mint(""), "svc")
		assert.NoError(t, err, "a token minted before the issuer was set")
	})

	t.Run("a bad bundle map keeps the last good bundles and the stream, and says so", func(t *testing.T) {
		failures := a.metrics.bundleResponses.WithLabelValues(resultFailure)
		before, streamErrs := testutil.ToFloat64(failures), testutil.ToFloat64(a.metrics.bundleStreamErrs)
		ident.set(t, []*spiffebundle.Bundle{caB.Bundle()}) // without the local trust domain
		assert.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Equal(c, before+1, testutil.ToFloat64(failures))
			assert.Contains(c, logs.String(), "without the local trust domain a.test")
		}, 5*time.Second, 5*time.Millisecond)
		assert.Contains(t, logs.String(), "do not parse; keeping the last good ones")
		assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.bundlesConnected), "the stream stays")
		assert.Equal(t, streamErrs, testutil.ToFloat64(a.metrics.bundleStreamErrs), "no reconnect")
		b, err := bundles.GetX509BundleForTrustDomain(tdA)
		require.NoError(t, err)
		assert.True(t, b.HasX509Authority(caA.Cert))
		_, err = bundles.GetBundleForTrustDomain(tdB)
		assert.Error(t, err, "nothing of the bad map is served")
	})

	t.Run("the server going away keeps the last good bundles, and says so", func(t *testing.T) {
		require.Equal(t, 1.0, testutil.ToFloat64(a.metrics.bundlesConnected))
		up.gs.Stop()
		assert.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Equal(c, 0.0, testutil.ToFloat64(a.metrics.bundlesConnected))
			assert.Contains(c, logs.String(), "keeps serving the last good bundles")
		}, 5*time.Second, 5*time.Millisecond)
		b, err := bundles.GetX509BundleForTrustDomain(tdA)
		require.NoError(t, err)
		assert.True(t, b.HasX509Authority(caA.Cert))
		c, err := workloadapi.New(ctx, workloadapi.WithAddr(endpointSocket(wlSock)))
		require.NoError(t, err)
		defer c.Close()
		fresh, err := c.FetchX509Bundles(ctx)
		require.NoError(t, err, "a new client is still served")
		_, err = fresh.GetX509BundleForTrustDomain(tdA)
		assert.NoError(t, err)
		assert.Equal(t, 1, strings.Count(logs.String(), "keeps serving the last good bundles"), "one warning per outage")
	})
}

func TestWorkloadAPIFiles(t *testing.T) {
	dir := shortDir(t)
	creds := filepath.Join(dir, "creds")
	require.NoError(t, mkdir(creds))
	caA, caB := testca.New(t, tdA.Name()), testca.New(t, tdB.Name())
	writeCreds(t, creds, caA, workload, caA.Cert, caB.Cert)
	sock, wlSock := filepath.Join(dir, "socket"), filepath.Join(dir, "wl.sock")
	a := newTestAgent(t, Config{SocketPath: sock, WorkloadAPISocket: wlSock, CredentialsDir: creds, PollInterval: 10 * time.Millisecond})
	_, done := runAgent(t, a)
	waitSocket(t, wlSock, done)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src, err := workloadapi.NewX509Source(ctx, sourceOpts(wlSock))
	require.NoError(t, err)
	defer src.Close()
	svid, err := src.GetX509SVID()
	require.NoError(t, err)
	assert.Equal(t, workload, svid.ID)
	b, err := src.GetX509BundleForTrustDomain(tdB)
	require.NoError(t, err, "the bundle map's trust domain is federated")
	assert.True(t, b.HasX509Authority(caB.Cert))

	leaf := writeCreds(t, creds, caA, workload, caA.Cert)
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		got, err := src.GetX509SVID()
		if assert.NoError(c, err) {
			assert.Equal(c, leaf.Raw, got.Certificates[0].Raw)
		}
		_, err = src.GetX509BundleForTrustDomain(tdB)
		assert.Error(c, err, "gone with the bundle map")
	}, 5*time.Second, 5*time.Millisecond)

	c, err := workloadapi.New(ctx, workloadapi.WithAddr(endpointSocket(wlSock)))
	require.NoError(t, err)
	defer c.Close()
	_, err = c.FetchJWTSVID(ctx, spiffejwt.Params{Audience: "x"})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "credential files")
}

func authnFor(ca *testca.CA) authn.Authenticator {
	return authn.NewX509SVID(ca.TrustDomain, bundleOf(ca), nil)
}

func mkdir(dir string) error { return os.MkdirAll(dir, 0o700) }

// The Workload API socket is handled like the SDS socket: a stale one is
// replaced, one a gRPC server answers on is left alone and Run fails, and
// the socket is 0600.
func TestWorkloadAPISocketHandling(t *testing.T) {
	t.Run("stale socket replaced", func(t *testing.T) {
		dir := shortDir(t)
		wlSock := filepath.Join(dir, "wl.sock")
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: wlSock, Net: "unix"})
		require.NoError(t, err)
		ln.SetUnlinkOnClose(false)
		require.NoError(t, ln.Close())
		before, err := os.Lstat(wlSock)
		require.NoError(t, err)
		ca := testca.New(t, tdA.Name())
		writeCreds(t, dir, ca, workload, ca.Cert)

		a := newTestAgent(t, Config{SocketPath: filepath.Join(dir, "socket"), WorkloadAPISocket: wlSock, CredentialsDir: dir})
		stop, done := runAgent(t, a)
		waitUnlessEnded(t, done, func() bool {
			fi, err := os.Lstat(wlSock)
			return err == nil && !os.SameFile(before, fi)
		})
		fi, err := os.Lstat(wlSock)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := workloadapi.New(ctx, workloadapi.WithAddr(endpointSocket(wlSock)))
		require.NoError(t, err)
		defer c.Close()
		svid, err := c.FetchX509SVID(ctx)
		require.NoError(t, err)
		assert.Equal(t, workload, svid.ID)
		require.NoError(t, stop())
		_, err = os.Lstat(wlSock)
		assert.ErrorIs(t, err, os.ErrNotExist, "removed at stop")
	})
	t.Run("live gRPC server kept", func(t *testing.T) {
		dir := shortDir(t)
		wlSock := filepath.Join(dir, "wl.sock")
		serveOn(t, grpc.NewServer(), wlSock)
		ca := testca.New(t, tdA.Name())
		writeCreds(t, dir, ca, workload, ca.Cert)
		a := newTestAgent(t, Config{SocketPath: filepath.Join(dir, "socket"), WorkloadAPISocket: wlSock, CredentialsDir: dir})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := a.Run(ctx)
		require.Error(t, err, "Run fails rather than serve beside another server")
		assert.Contains(t, err.Error(), "already answers on "+wlSock)
		fi, err := os.Lstat(wlSock)
		require.NoError(t, err, "the other server's socket stays")
		assert.Equal(t, os.ModeSocket, fi.Mode().Type())
	})
	t.Run("same path as SDS refused", func(t *testing.T) {
		_, err := New(Config{SocketPath: "/tmp/x.sock", WorkloadAPISocket: "/tmp/./x.sock"})
		assert.ErrorContains(t, err, "is the SDS socket")
	})
}

// A WatchBundles message whose jwt_issuer this agent cannot read keeps
// the issuer it had (and says so, once), while its bundles are taken.
func TestJWTIssuerCellKeepsIssuerOnUnreadable(t *testing.T) {
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	var c jwtIssuerCell
	c.take(tdA, &caclient.Bundles{JWTIssuer: "https://oidc.a.test"}, log)
	assert.Equal(t, "https://oidc.a.test", c.of(tdA))
	assert.Empty(t, c.of(tdB), "the issuer is the local trust domain's only")
	bad := &caclient.Bundles{JWTIssuerErr: errors.New("the server's JWT issuer: bad")}
	c.take(tdA, bad, log)
	c.take(tdA, bad, log)
	assert.Equal(t, "https://oidc.a.test", c.of(tdA), "kept")
	assert.Equal(t, 1, strings.Count(logs.String(), "cannot read"), "said once")
	c.take(tdA, &caclient.Bundles{}, log)
	assert.Empty(t, c.of(tdA), "a server without an issuer clears it")
}
