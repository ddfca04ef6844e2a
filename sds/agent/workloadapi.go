package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/netutil"
	"github.com/trustbridge/trustbridge/sds"
	wapi "github.com/trustbridge/trustbridge/sds/workload"
)

// noJWTFiles is why an agent serving credential files mints no JWT-SVIDs.
const noJWTFiles = "the agent serves credential files and has no certificate service to mint them; run it with --ca-addr"

// workloadAPI is what the Workload API socket serves.
type workloadAPI struct {
	src   wapi.Source
	jwt   wapi.JWTMinter
	noJWT string
	// sel, when set in place of src, serves each caller its own Source
	// (a node agent), with creds the socket's transport credentials
	// (attestation's); the socket is then open to every local user.
	sel       wapi.Selector
	callerJWT wapi.CallerJWTMinter
	creds     credentials.TransportCredentials
	reselect  time.Duration
	// closers run when the agent stops (the minter's connection).
	closers []func()
}

func (w *workloadAPI) close() {
	for _, c := range w.closers {
		c()
	}
}

// startWorkloadAPI opens the Workload API socket and serves it until ctx
// is done; a failure to open it or to serve fails the agent, like SDS.
func (a *Agent) startWorkloadAPI(ctx context.Context, wl *workloadAPI, wg *sync.WaitGroup, fail func(error)) {
	srv, err := wapi.New(wapi.Config{
		Source: wl.src, JWT: wl.jwt, NoJWTReason: wl.noJWT,
		Selector: wl.sel, CallerJWT: wl.callerJWT, Credentials: wl.creds, ReselectInterval: wl.reselect,
		JWTIssuer: a.jwtIssuer.of,
		Clock:     a.clock, Logger: a.log, Registerer: a.reg,
	})
	if err != nil {
		fail(fmt.Errorf("agent: %w", err))
		return
	}
	gid := a.wlGID
	if wl.sel != nil {
		gid = netutil.AnyUser
	}
	ln, err := listenWorkloadSocket(ctx, a.wlSocket, gid, a.probeTimeout)
	if err != nil {
		fail(fmt.Errorf("agent: Workload API socket: %w", err))
		return
	}
	a.log.Info("SPIFFE Workload API listening", "socket", a.wlSocket, "SPIFFE_ENDPOINT_SOCKET", endpointSocket(a.wlSocket))
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer ln.Close()
		if err := srv.Serve(ctx, ln); err != nil && ctx.Err() == nil {
			fail(fmt.Errorf("agent: %w", err))
		}
	}()
}

// endpointSocket is the SPIFFE_ENDPOINT_SOCKET value for a socket path:
// an absolute unix URL (Workload Endpoint §4).
func endpointSocket(path string) string {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return "unix://" + path
}

// listenWorkloadSocket creates the Workload API socket at path, replacing
// a socket there only when no gRPC server answers on it.
func listenWorkloadSocket(ctx context.Context, path string, gid int, probeTimeout time.Duration) (*netutil.UnixListener, error) {
	return netutil.ListenUnix(path, gid, func(path string) error {
		if grpcAnswers(ctx, path, probeTimeout) {
			return fmt.Errorf("a gRPC server (another agent's Workload API?) already answers on %s; not replacing it", path)
		}
		return nil
	})
}

// grpcAnswers reports whether a gRPC server answers on the unix socket
// at path within timeout: a Workload API call with any status but a
// transport failure is an answer.
func grpcAnswers(ctx context.Context, path string, timeout time.Duration) bool {
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != fs.ModeSocket {
		return false
	}
	conn, err := grpc.NewClient("passthrough:///workload-api-probe",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}),
	)
	if err != nil {
		return false
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(ctx, metadata.Pairs(wapi.Header, "true")), timeout)
	defer cancel()
	_, err = workloadpb.NewSpiffeWorkloadAPIClient(conn).ValidateJWTSVID(cctx, &workloadpb.ValidateJWTSVIDRequest{})
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return conn.GetState() == connectivity.Ready
	}
	return true
}

// caWorkloadAPI is the Workload API of an agent with a CA: the SVID from
// the Rotator, bundles from the server's WatchBundles, JWT-SVIDs from its
// MintJWTSVIDs. It returns the workers to run.
func (a *Agent) caWorkloadAPI(id spiffeid.ID) (*workloadAPI, []func(context.Context) error) {
	bundles := newBundleCell(seedBundles(a.rot.Trust()), errNoBundlesYet)
	bw := &bundleWatcher{
		addr: a.caAddr, tlsConfig: a.rot.ClientTLS, local: id.TrustDomain(), out: bundles, issuer: &a.jwtIssuer, taints: &a.taints,
		clock: a.clock, log: a.log, metrics: a.metrics,
		retry: a.retry,
	}
	minter := newJWTMinter(a.caAddr, a.rot.ClientTLS, a.clock)
	minter.followTaints(&a.taints)
	cell := wapi.NewCell()
	c := &composer{creds: a.rot.Cell(), id: id, bundles: bundles, trust: a.rot.Trust, out: cell, log: a.log}
	compose := c.Run
	wl := &workloadAPI{src: cell, jwt: minter, closers: []func(){minter.close}}
	return wl, []func(context.Context) error{bw.Run, compose}
}

// taintWatcher follows the server's WatchBundles for id for the tainted
// authorities alone, for an agent without a Workload API: its Rotator
// re-issues a certificate a tainted authority signed as one with does.
func (a *Agent) taintWatcher(id spiffeid.ID) *bundleWatcher {
	return &bundleWatcher{
		addr: a.caAddr, tlsConfig: a.rot.ClientTLS, local: id.TrustDomain(), out: newBundleCell(nil, errNoBundlesYet),
		issuer: &a.jwtIssuer, taints: &a.taints, taintsOnly: true,
		clock: a.clock, log: a.log, metrics: a.metrics,
		retry: a.retry,
	}
}

// errNoBundlesYet is the Stale of the bundles before the server's first
// WatchBundles answer: the local roots the certificate came with.
var errNoBundlesYet = errors.New("no bundles from the server yet; serving the local trust domain's roots from the first certificate")

// seedBundles is the local trust domain's roots the server handed out
// with the first certificate; federated ones wait for WatchBundles, which
// says which the workload may trust without limits.
func seedBundles(t caclient.Trust) []*spiffebundle.Bundle {
	if len(t.Local) == 0 {
		return nil
	}
	return []*spiffebundle.Bundle{spiffebundle.FromX509Authorities(t.TrustDomain, t.Local)}
}

// composer publishes the Rotator's credential with the bundles into out,
// again on every change of either. A State the cell refuses (bundles
// without the local trust domain, an SVID its bundle does not vouch for)
// is logged and the last good one stays.
type composer struct {
	creds   *sds.CredentialCell
	id      spiffeid.ID
	bundles *bundleCell
	// trust is the Rotator's, renewed with every certificate: the local
	// trust domain's roots while the bundles are the seed or stale.
	trust func() caclient.Trust
	out   *wapi.Cell
	log   *slog.Logger
}

// Run composes until ctx is done.
func (c *composer) Run(ctx context.Context) error {
	for {
		cred, err := c.creds.Credential(ctx, c.id)
		if err != nil {
			return fmt.Errorf("workload API: %w", err)
		}
		bs, changed, delivered, stale := c.bundles.get()
		if stale != nil {
			// Without WatchBundles (an older server, an outage) the local
			// roots would stay those of the seed or the last good bundles
			// while the Rotator follows a root rotation: serve the roots
			// the new certificate came with too. Read after the
			// credential, so they are at least as new.
			bs = withLocalRoots(bs, c.trust(), c.id.TrustDomain(), delivered)
		}
		st := wapi.State{SVID: &wapi.SVID{ID: c.id, Chain: cred.Chain, Key: cred.Key}, Bundles: bs, Stale: stale}
		if err := c.out.Set(st); err != nil {
			c.log.Error("not serving this identity and bundles over the Workload API; keeping the last good ones", logattr.Error, err.Error())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-cred.Changed:
		case <-changed:
		}
	}
}

// withLocalRoots is bs with t's local roots as local's X.509 authorities,
// its JWT authorities kept. With keep (bs are WatchBundles' last good
// ones) they are added to local's: those may hold a root the CA prepared
// after the Rotator's last renewal, and dropping it on a stream error
// would make workloads refuse peers it signs for while the server is
// away. Otherwise (bs are the seed) they replace them. Only the local
// trust domain is taken from t: federated trust comes from WatchBundles
// alone, which applies the trust policy's limits.
func withLocalRoots(bs []*spiffebundle.Bundle, t caclient.Trust, local spiffeid.TrustDomain, keep bool) []*spiffebundle.Bundle {
	if t.TrustDomain != local || len(t.Local) == 0 {
		return bs
	}
	out := make([]*spiffebundle.Bundle, 0, len(bs)+1)
	found := false
	for _, b := range bs {
		if b.TrustDomain() == local {
			b = b.Clone()
			if !keep {
				b.SetX509Authorities(nil)
			}
			for _, r := range t.Local {
				b.AddX509Authority(r)
			}
			found = true
		}
		out = append(out, b)
	}
	if !found {
		out = append(out, spiffebundle.FromX509Authorities(local, t.Local))
	}
	return out
}

// bundleCell holds the bundles for the Workload API and whether they are
// stale, with a channel closed on change.
type bundleCell struct {
	mu      sync.Mutex
	bundles []*spiffebundle.Bundle
	stale   error
	// delivered is set once the bundles were good (the server's)
	// rather than the seed.
	delivered bool
	changed   chan struct{}
}

// newBundleCell holds seed, stale when stale is non-nil; bundles that are
// not stale count as delivered, so a later outage keeps their roots.
func newBundleCell(seed []*spiffebundle.Bundle, stale error) *bundleCell {
	return &bundleCell{bundles: seed, stale: stale, delivered: stale == nil, changed: make(chan struct{})}
}

// get returns the bundles, a channel closed on change, whether they were
// ever set (false while they are the seed), and the error that makes
// them stale (nil when fresh).
func (c *bundleCell) get() ([]*spiffebundle.Bundle, <-chan struct{}, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bundles, c.changed, c.delivered, c.stale
}

// set replaces the bundles and clears stale.
func (c *bundleCell) set(bundles []*spiffebundle.Bundle) {
	c.update(func() { c.bundles, c.stale, c.delivered = bundles, nil, true })
}

// setStale keeps the bundles and marks them stale (err non-nil).
func (c *bundleCell) setStale(err error) {
	c.update(func() { c.stale = err })
}

func (c *bundleCell) update(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f()
	close(c.changed)
	c.changed = make(chan struct{})
}
