package workload

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	spiffejwt "github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
)

// callerKey is the metadata the test clients set to say who they are: the
// test Selector reads it from the call's context, where a node agent's
// reads the AuthInfo of its attesting transport credentials.
const callerKey = "test-caller"

var db = spiffeid.RequireFromString("spiffe://a.test/ns/default/sa/db")

// choice is what the test Selector answers for one caller.
type choice struct {
	src Source
	err error
}

// mapSelector selects by the callerKey metadata of the call, and counts
// its selections and their releases.
type mapSelector struct {
	mu      sync.Mutex
	by      map[string]choice
	open    int // selections not yet released
	total   int // selections
	twice   int // releases called more than once
	changed chan struct{}
}

func newMapSelector(by map[string]choice) *mapSelector {
	return &mapSelector{by: by, changed: make(chan struct{})}
}

func (m *mapSelector) set(caller string, c choice) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.by[caller] = c
}

func (m *mapSelector) Select(ctx context.Context) (Source, func(), error) {
	md, _ := metadata.FromIncomingContext(ctx)
	callers := md.Get(callerKey)
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(callers) != 1 {
		return nil, nil, fmt.Errorf("%w: the caller did not say who it is", authn.ErrNotAttested)
	}
	c, ok := m.by[callers[0]]
	switch {
	case !ok:
		return nil, nil, fmt.Errorf("%w: caller %q: no identity map rule grants it an identity", authn.ErrNotAttested, callers[0])
	case c.err != nil:
		return nil, nil, c.err
	}
	m.open++
	m.total++
	m.signal()
	var once sync.Once
	return c.src, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		called := true
		once.Do(func() { called = false; m.open-- })
		if called {
			m.twice++
		}
		m.signal()
	}, nil
}

// signal wakes the waiters of the counters; m.mu is held.
func (m *mapSelector) signal() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// waitFor waits until cond holds of (open, total), or fails the test.
func (m *mapSelector) waitFor(t *testing.T, what string, cond func(open, total int) bool) {
	t.Helper()
	timeout := time.After(waitFor)
	for {
		m.mu.Lock()
		ok, ch := cond(m.open, m.total), m.changed
		open, total := m.open, m.total
		m.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("%s: still %d selections open of %d", what, open, total)
		}
	}
}

// released waits until every selection was released, and checks that
// none was released twice.
func (m *mapSelector) released(t *testing.T) {
	t.Helper()
	m.waitFor(t, "every selection released", func(open, _ int) bool { return open == 0 })
	m.mu.Lock()
	defer m.mu.Unlock()
	assert.Zero(t, m.twice, "releases called more than once")
}

// as is the dial options of a client that says it is caller.
func as(caller string) []grpc.DialOption {
	add := func(ctx context.Context) context.Context {
		return metadata.AppendToOutgoingContext(ctx, callerKey, caller)
	}
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(add(ctx), method, req, reply, cc, opts...)
	}), grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(add(ctx), desc, cc, method, opts...)
	})}
}

// callerClient is a raw Workload API client of caller, sending the
// security header itself.
func callerClient(t *testing.T, addr, caller string) workloadpb.SpiffeWorkloadAPIClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, append(as(caller), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return workloadpb.NewSpiffeWorkloadAPIClient(conn)
}

// callerJWT mints for any identity of a.test with a.test's key.
type callerJWT struct {
	key crypto.Signer
	kid string
}

func (c callerJWT) MintJWTSVIDFor(_ context.Context, id spiffeid.ID, audience []string) (string, error) {
	now := time.Now()
	return jwtsvid.Mint(c.key, c.kid, jwtsvid.Claims{Subject: id, Audience: audience, IssuedAt: now, Expiry: now.Add(5 * time.Minute)})
}

// identityCell is a Cell holding an SVID of id from a.test, with a.test's
// bundle and, with federated, b.test's.
func (w *world) identityCell(t *testing.T, id spiffeid.ID, federated bool) *Cell {
	t.Helper()
	leaf, key := w.caA.Issue(t, id)
	bundles := []*spiffebundle.Bundle{w.bundleA(t)}
	if federated {
		bundles = append(bundles, w.bundleB(t))
	}
	cell := NewCell()
	require.NoError(t, cell.Set(State{SVID: &SVID{ID: id, Chain: []*x509.Certificate{leaf}, Key: key}, Bundles: bundles}))
	return cell
}

func TestNewSourceOrSelector(t *testing.T) {
	sel := SelectorFunc(func(context.Context) (Source, func(), error) { return NewCell(), nil, nil })
	tests := []struct {
		name string
		cfg  Config
		err  string
	}{
		{"neither", Config{}, "no source"},
		{"both", Config{Source: NewCell(), Selector: sel}, "set one"},
		{"one identity's minter with a selector", Config{Selector: sel, JWT: signer{}}, "set CallerJWT instead"},
		{"both minters", Config{Source: NewCell(), JWT: signer{}, CallerJWT: callerJWT{}}, "both JWT and CallerJWT"},
		{"selector", Config{Selector: sel, CallerJWT: callerJWT{}}, ""},
		{"source with a caller minter", Config{Source: NewCell(), CallerJWT: callerJWT{}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if tt.err == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.err)
			assert.Contains(t, err.Error(), "workload: ")
		})
	}
}

// TestSelectorServesEachCallerItsOwn: two callers of one server, selected
// to two Sources, get two identities through go-spiffe's client, each its
// own bundles and JWT-SVIDs, and a JWT-SVID for the other's identity is
// refused.
func TestSelectorServesEachCallerItsOwn(t *testing.T) {
	w := newWorld(t)
	sel := newMapSelector(map[string]choice{
		"web": {src: w.identityCell(t, web, true)},
		"db":  {src: w.identityCell(t, db, false)},
	})
	addr, _ := serve(t, Config{Selector: sel, CallerJWT: callerJWT{w.jwtA, kidA}})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	for _, tc := range []struct {
		caller    string
		id, other spiffeid.ID
		federated bool
	}{
		{"web", web, db, true},
		{"db", db, web, false},
	} {
		t.Run(tc.caller, func(t *testing.T) {
			src, err := workloadapi.NewX509Source(ctx, workloadapi.WithClientOptions(workloadapi.WithAddr(addr), workloadapi.WithDialOptions(as(tc.caller)...)))
			require.NoError(t, err)
			defer src.Close()
			got, err := src.GetX509SVID()
			require.NoError(t, err)
			assert.Equal(t, tc.id, got.ID)
			_, err = src.GetX509BundleForTrustDomain(tdB)
			assert.Equal(t, tc.federated, err == nil, "b.test's bundle is %s's only", web)

			c, err := workloadapi.New(ctx, workloadapi.WithAddr(addr), workloadapi.WithDialOptions(as(tc.caller)...))
			require.NoError(t, err)
			defer c.Close()
			jwt, err := c.FetchJWTSVID(ctx, spiffejwt.Params{Audience: "svc"})
			require.NoError(t, err)
			assert.Equal(t, tc.id, jwt.ID)
			validated, err := c.ValidateJWTSVID(ctx, jwt.Marshal(), "svc")
			require.NoError(t, err)
			assert.Equal(t, tc.id, validated.ID)
			_, err = c.FetchJWTSVID(ctx, spiffejwt.Params{Audience: "svc", Subject: tc.other})
			assert.Equal(t, codes.PermissionDenied, status.Code(err))
			assert.Contains(t, status.Convert(err).Message(), "entitled to "+tc.id.String()+" only")
		})
	}
	sel.released(t)
	sel.mu.Lock()
	defer sel.mu.Unlock()
	assert.Equal(t, 2*4, sel.total, "per caller: the X509Source's stream, two FetchJWTSVID and a ValidateJWTSVID")
}

// TestSelectorRefusals: a caller the Selector refuses gets, on every
// method, PermissionDenied with the reason, or Unavailable when the
// Selector cannot decide yet; a Selector that answers no Source is an
// Internal error. Each refusal is counted and logged.
func TestSelectorRefusals(t *testing.T) {
	w := newWorld(t)
	sel := newMapSelector(map[string]choice{
		"web":        {src: w.identityCell(t, web, false)},
		"no-rule":    {err: fmt.Errorf("%w: pid 42: no identity map rule grants an identity to these facts", authn.ErrNotAttested)},
		"kube-down":  {err: fmt.Errorf("%w: %w: the pods of this node cannot be read", authn.ErrNotAttested, authn.ErrUnavailable)},
		"no-source":  {},
		"no-svid":    {src: NewCell()},
		"not-mapped": {err: errors.New("pid 7: process exited")},
	})
	var logs syncBuffer
	addr, reg := serve(t, Config{Selector: sel, CallerJWT: callerJWT{w.jwtA, kidA}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx, cancel := context.WithTimeout(withHeader(context.Background()), waitFor)
	defer cancel()

	calls := map[string]func(workloadpb.SpiffeWorkloadAPIClient) error{
		"FetchX509SVID": func(c workloadpb.SpiffeWorkloadAPIClient) error {
			st, err := c.FetchX509SVID(ctx, &workloadpb.X509SVIDRequest{})
			if err == nil {
				_, err = st.Recv()
			}
			return err
		},
		"FetchX509Bundles": func(c workloadpb.SpiffeWorkloadAPIClient) error {
			st, err := c.FetchX509Bundles(ctx, &workloadpb.X509BundlesRequest{})
			if err == nil {
				_, err = st.Recv()
			}
			return err
		},
		"FetchJWTBundles": func(c workloadpb.SpiffeWorkloadAPIClient) error {
			st, err := c.FetchJWTBundles(ctx, &workloadpb.JWTBundlesRequest{})
			if err == nil {
				_, err = st.Recv()
			}
			return err
		},
		"FetchJWTSVID": func(c workloadpb.SpiffeWorkloadAPIClient) error {
			_, err := c.FetchJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{"svc"}})
			return err
		},
		"ValidateJWTSVID": func(c workloadpb.SpiffeWorkloadAPIClient) error {
			_, err := c.ValidateJWTSVID(ctx, &workloadpb.ValidateJWTSVIDRequest{Audience: "svc", Svid: "a.b.c"})
			return err
		},
	}
	tests := []struct {
		caller string
		code   codes.Code
		msg    string
		// refused: counted as the Selector's refusal (no-svid is the
		// State's "no identity issued", as with one Source).
		refused bool
	}{
		{"no-rule", codes.PermissionDenied, "not attested: pid 42: no identity map rule grants an identity", true},
		{"unknown", codes.PermissionDenied, `caller "unknown": no identity map rule`, true},
		{"not-mapped", codes.PermissionDenied, "pid 7: process exited", true},
		{"kube-down", codes.Unavailable, "the pods of this node cannot be read", true},
		{"no-source", codes.Internal, "could not select the caller's identity", true},
		{"no-svid", codes.PermissionDenied, "no identity issued", false},
	}
	for _, tt := range tests {
		t.Run(tt.caller, func(t *testing.T) {
			client := callerClient(t, addr, tt.caller)
			for method, call := range calls {
				refusals := func() float64 {
					return testutil.ToFloat64(gatherOne(t, reg, "trustbridge_workload_api_selection_refusals_total",
						map[string]string{"method": method, "code": tt.code.String()}))
				}
				before := refusals()
				err := call(client)
				assert.Equal(t, tt.code, status.Code(err), "%s: %v", method, err)
				assert.Contains(t, status.Convert(err).Message(), tt.msg, method)
				want := before
				if tt.refused {
					want++
				}
				assert.Equal(t, want, refusals(), method)
			}
		})
	}
	assert.Contains(t, logs.String(), "pid 42: no identity map rule")
	assert.Contains(t, logs.String(), "level=ERROR", "a Selector's fault is an error")
	assert.Equal(t, 4.0, testutil.ToFloat64(mustRequests(t, reg, "FetchX509SVID", codes.PermissionDenied)), "no-rule, unknown, not-mapped and no-svid")
	sel.released(t)
}

// reselecting is a server with a Selector on a fake clock, and a caller
// "w" selected to web's Cell.
type reselecting struct {
	w        *world
	sel      *mapSelector
	clock    *testingclock.FakeClock
	webCell  *Cell
	dbCell   *Cell
	addr     string
	reg      *prometheus.Registry
	interval time.Duration
}

func newReselecting(t *testing.T) *reselecting {
	t.Helper()
	r := &reselecting{w: newWorld(t), clock: testingclock.NewFakeClock(time.Now()), interval: time.Minute}
	r.webCell, r.dbCell = r.w.identityCell(t, web, false), r.w.identityCell(t, db, false)
	r.sel = newMapSelector(map[string]choice{"w": {src: r.webCell}})
	r.addr, r.reg = serve(t, Config{Selector: r.sel, Clock: r.clock, ReselectInterval: r.interval})
	return r
}

// recvID receives the next X509SVIDResponse and returns its SPIFFE ID.
func recvID(t *testing.T, st workloadpb.SpiffeWorkloadAPI_FetchX509SVIDClient) string {
	t.Helper()
	resp, err := st.Recv()
	require.NoError(t, err)
	require.Len(t, resp.GetSvids(), 1)
	return resp.GetSvids()[0].GetSpiffeId()
}

// TestStreamReselects: an open stream follows its caller's identity, at
// the re-selection interval and on a change of its Source's State, and
// ends with the caller's refusal rather than serve the identity it had.
func TestStreamReselects(t *testing.T) {
	r := newReselecting(t)
	ctx, cancel := context.WithTimeout(withHeader(context.Background()), waitFor)
	defer cancel()
	st, err := callerClient(t, r.addr, "w").FetchX509SVID(ctx, &workloadpb.X509SVIDRequest{})
	require.NoError(t, err)
	require.Equal(t, web.String(), recvID(t, st))

	// The stream armed its timer before its first message.
	r.sel.set("w", choice{src: r.dbCell})
	r.clock.Step(r.interval)
	assert.Equal(t, db.String(), recvID(t, st), "the interval's re-selection switches the stream")

	// A change of db's State re-selects too: the caller is web again. The
	// stream read db's State before it sent it, so it sees the change.
	r.sel.set("w", choice{src: r.webCell})
	leaf, key := r.w.caA.Issue(t, db)
	require.NoError(t, r.dbCell.Set(State{SVID: &SVID{ID: db, Chain: []*x509.Certificate{leaf}, Key: key}, Bundles: []*spiffebundle.Bundle{r.w.bundleA(t)}}))
	assert.Equal(t, web.String(), recvID(t, st), "the change's re-selection switches the stream back")

	t.Run("the same Source again keeps the stream as it is", func(t *testing.T) {
		r.clock.Step(r.interval)
		r.sel.waitFor(t, "re-selected", func(open, total int) bool { return total == 4 && open == 1 })
	})

	r.sel.set("w", choice{err: fmt.Errorf("%w: pod default/web: service account changed to one no rule maps", authn.ErrNotAttested)})
	r.clock.Step(r.interval)
	_, err = st.Recv()
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "service account changed")
	r.sel.released(t)
	assert.Equal(t, 1.0, testutil.ToFloat64(gatherOne(t, r.reg, "trustbridge_workload_api_selection_refusals_total",
		map[string]string{"method": "FetchX509SVID", "code": codes.PermissionDenied.String()})))
}

// TestStreamReselectUnavailable: a re-selection that cannot decide ends
// the stream Unavailable, so the client retries; it does not keep the
// identity it had.
func TestStreamReselectUnavailable(t *testing.T) {
	r := newReselecting(t)
	ctx, cancel := context.WithTimeout(withHeader(context.Background()), waitFor)
	defer cancel()
	st, err := callerClient(t, r.addr, "w").FetchJWTBundles(ctx, &workloadpb.JWTBundlesRequest{})
	require.NoError(t, err)
	_, err = st.Recv()
	require.NoError(t, err)
	r.sel.set("w", choice{err: fmt.Errorf("%w: %w: pods not listed yet", authn.ErrNotAttested, authn.ErrUnavailable)})
	r.clock.Step(r.interval)
	_, err = st.Recv()
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "pods not listed yet")
	r.sel.released(t)
}

// TestSelectorSharesEncoding: the streams of many callers selected to one
// Cell cost one encoding per State of that Cell, not one per stream.
func TestSelectorSharesEncoding(t *testing.T) {
	w := newWorld(t)
	cell := w.identityCell(t, web, true)
	callers := []string{"a", "b", "c", "d"}
	by := map[string]choice{}
	for _, c := range callers {
		by[c] = choice{src: cell}
	}
	sel := newMapSelector(by)
	addr, reg := serve(t, Config{Selector: sel})
	encodings := func() float64 {
		return testutil.ToFloat64(gatherOne(t, reg, "trustbridge_workload_api_encodings_total", nil))
	}
	ctx, cancel := context.WithTimeout(withHeader(context.Background()), waitFor)
	defer cancel()
	var streams []workloadpb.SpiffeWorkloadAPI_FetchX509SVIDClient
	for _, c := range callers {
		client := callerClient(t, addr, c)
		for range 3 {
			st, err := client.FetchX509SVID(ctx, &workloadpb.X509SVIDRequest{})
			require.NoError(t, err)
			require.Equal(t, web.String(), recvID(t, st))
			streams = append(streams, st)
		}
	}
	assert.Equal(t, 1.0, encodings(), "one State, one encoding for %d streams", len(streams))

	leaf, key := w.caA.Issue(t, web)
	require.NoError(t, cell.Set(State{SVID: &SVID{ID: web, Chain: []*x509.Certificate{leaf}, Key: key}, Bundles: []*spiffebundle.Bundle{w.bundleA(t), w.bundleB(t)}}))
	for _, st := range streams {
		resp, err := st.Recv()
		require.NoError(t, err)
		assert.Equal(t, leaf.Raw, resp.GetSvids()[0].GetX509Svid())
	}
	assert.Equal(t, 2.0, encodings(), "a rotation, one encoding more")
	cancel()
	sel.released(t)
}

// markedCreds are insecure transport credentials whose server side marks
// each connection's AuthInfo, as sds/attest's carry the caller.
type markedCreds struct {
	credentials.TransportCredentials
}

type markedInfo struct{ credentials.CommonAuthInfo }

func (markedInfo) AuthType() string { return "marked" }

func (c markedCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, _, err := c.TransportCredentials.ServerHandshake(conn)
	return conn, markedInfo{credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, err
}

func (c markedCreds) Clone() credentials.TransportCredentials {
	return markedCreds{c.TransportCredentials.Clone()}
}

// TestSelectorReadsCredentials: the AuthInfo of Config.Credentials
// reaches the Selector in the call's context, which is how a node agent's
// Selector finds the process it attests; without them, nothing does.
func TestSelectorReadsCredentials(t *testing.T) {
	w := newWorld(t)
	cell := w.identityCell(t, web, false)
	sel := SelectorFunc(func(ctx context.Context) (Source, func(), error) {
		if p, ok := peer.FromContext(ctx); ok {
			if _, marked := p.AuthInfo.(markedInfo); marked {
				return cell, nil, nil
			}
		}
		return nil, nil, fmt.Errorf("%w: no caller credentials on the connection", authn.ErrNotAttested)
	})
	for _, tt := range []struct {
		name  string
		creds credentials.TransportCredentials
		code  codes.Code
	}{
		{"with", markedCreds{insecure.NewCredentials()}, codes.OK},
		{"without", nil, codes.PermissionDenied},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr, _ := serve(t, Config{Selector: sel, Credentials: tt.creds})
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			c, err := workloadapi.New(ctx, workloadapi.WithAddr(addr))
			require.NoError(t, err)
			defer c.Close()
			svid, err := c.FetchX509SVID(ctx)
			require.Equal(t, tt.code, status.Code(err), "%v", err)
			if tt.code == codes.OK {
				assert.Equal(t, web, svid.ID)
			} else {
				assert.Contains(t, status.Convert(err).Message(), "no caller credentials")
			}
		})
	}
}
