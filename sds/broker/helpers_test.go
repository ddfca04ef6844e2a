package broker

import (
	"context"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	brokerpb "github.com/spiffe/go-spiffe/v2/exp/proto/spiffe/broker"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	delegatedv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/agent/delegatedidentity/v1"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	wapi "github.com/trustbridge/trustbridge/sds/workload"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var (
	tdA    = spiffeid.RequireTrustDomainFromString("a.test")
	tdB    = spiffeid.RequireTrustDomainFromString("b.test")
	web    = spiffeid.RequireFromString("spiffe://a.test/ns/shop/sa/web")
	api    = spiffeid.RequireFromString("spiffe://a.test/ns/shop/sa/api")
	ztun   = spiffeid.RequireFromString("spiffe://a.test/ns/istio-system/sa/ztunnel")
	webUID = "0fa1b2c3-4d5e-6f70-8192-a3b4c5d6e7f8"
)

// fakeNode resolves references from a table; each entry is a Cell the
// test sets.
type fakeNode struct {
	mu        sync.Mutex
	caller    Caller
	callerErr error
	byRef     map[string]*fakeWorkload
	self      *fakeWorkload
	held      int // identities held now
	resolved  int
}

type fakeWorkload struct {
	id   spiffeid.ID
	cell *wapi.Cell
	src  wapi.Source // instead of cell
	gone chan struct{}
	err  error // Resolve's answer instead
	// again, when set, is the Workload's Again: what resolving it again
	// answers.
	again func() error
}

func (n *fakeNode) IdentifyCaller(context.Context) (Caller, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.caller, n.callerErr
}

func (n *fakeNode) Resolve(_ context.Context, ref Reference) (*Workload, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.resolveLocked(n.byRef[ref.String()], ref.String())
}

func (n *fakeNode) ResolveCaller(context.Context) (*Workload, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.resolveLocked(n.self, "self")
}

func (n *fakeNode) resolveLocked(w *fakeWorkload, name string) (*Workload, error) {
	n.resolved++
	if w == nil {
		return nil, ErrNotFound
	}
	if w.err != nil {
		return nil, w.err
	}
	n.held++
	var src wapi.Source = w.cell
	if w.src != nil {
		src = w.src
	}
	wl := &Workload{ID: w.id, Source: src, Gone: w.gone, Name: name, Release: func() {
		n.mu.Lock()
		n.held--
		n.mu.Unlock()
	}}
	if w.again != nil {
		wl.Again = func(context.Context) (*Workload, error) {
			if err := w.again(); err != nil {
				return nil, err
			}
			n.mu.Lock()
			defer n.mu.Unlock()
			fresh := *w
			fresh.gone = make(chan struct{})
			return n.resolveLocked(&fresh, name)
		}
	}
	return wl, nil
}

func (n *fakeNode) set(f func(n *fakeNode)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f(n)
}

func (n *fakeNode) holding() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.held
}

// world is trust domain a.test with a federated b.test.
type world struct {
	caA, caB *testca.CA
}

func newWorld(t testing.TB) *world {
	return &world{caA: testca.New(t, tdA.Name()), caB: testca.New(t, tdB.Name())}
}

// state is id's SVID with both trust domains.
func (w *world) state(t testing.TB, id spiffeid.ID) wapi.State {
	leaf, key := w.caA.Issue(t, id)
	return wapi.State{
		SVID:    &wapi.SVID{ID: id, Chain: []*x509.Certificate{leaf}, Key: key},
		Bundles: w.bundles(),
	}
}

func (w *world) bundles() []*spiffebundle.Bundle {
	return []*spiffebundle.Bundle{w.caA.Bundle(), w.caB.Bundle()}
}

func cellOf(t testing.TB, st wapi.State) *wapi.Cell {
	c := wapi.NewCell()
	require.NoError(t, c.Set(st))
	return c
}

type fakeJWT struct {
	mu     sync.Mutex
	minted []spiffeid.ID
}

func (f *fakeJWT) MintJWTSVIDFor(_ context.Context, id spiffeid.ID, aud []string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.minted = append(f.minted, id)
	return "token-for-" + id.String(), nil
}

// serve runs a Server for cfg on a unix socket and returns a connection
// to it.
func serve(t *testing.T, cfg Config) (*grpc.ClientConn, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	srv, err := New(cfg)
	require.NoError(t, err)
	d, err := os.MkdirTemp("", "brk")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(d) })
	path := filepath.Join(d, "broker.sock")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	gs := grpc.NewServer()
	srv.Register(gs)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(ln)
	}()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
		<-done
	})
	return conn, reg
}

// brokerCtx carries the Broker API's security header.
func brokerCtx(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, Header, "true")
}

func pidRef(t testing.TB, pid int32) *brokerpb.WorkloadReference {
	a, err := anypb.New(&brokerpb.WorkloadPIDReference{Pid: pid})
	require.NoError(t, err)
	return &brokerpb.WorkloadReference{Reference: a}
}

func podRef(t testing.TB, ns, name, uid string) *brokerpb.WorkloadReference {
	k := &brokerpb.KubernetesObjectReference{Type: &brokerpb.KubernetesObjectType{Plural: "pods", Group: "core"}, Uid: uid}
	if name != "" {
		k.Key = &brokerpb.KubernetesObjectKey{Namespace: ns, Name: name}
	}
	a, err := anypb.New(k)
	require.NoError(t, err)
	return &brokerpb.WorkloadReference{Reference: a}
}

func clients(conn *grpc.ClientConn) (brokerpb.APIClient, delegatedv1.DelegatedIdentityClient) {
	return brokerpb.NewAPIClient(conn), delegatedv1.NewDelegatedIdentityClient(conn)
}

// testcaRoot is a new root for b.test.
func testcaRoot(t testing.TB) *x509.Certificate {
	return testca.New(t, tdB.Name()).Cert
}

func bundleOf(td spiffeid.TrustDomain, roots ...*x509.Certificate) *spiffebundle.Bundle {
	b := spiffebundle.New(td)
	b.SetX509Authorities(roots)
	return b
}

func gauge(reg *prometheus.Registry, api, method string) prometheus.Collector {
	return series(reg, "trustbridge_broker_streams", map[string]string{"api": api, "method": method})
}

func requests(reg *prometheus.Registry, api, method string, code codes.Code) prometheus.Collector {
	return series(reg, "trustbridge_broker_requests_total", map[string]string{"api": api, "method": method, "code": code.String()})
}

// series is one series of reg, as a collector testutil reads (0 when
// it does not exist).
func series(reg *prometheus.Registry, name string, labels map[string]string) prometheus.Collector {
	v := 0.0
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue metric
				}
			}
			if m.GetGauge() != nil {
				v = m.GetGauge().GetValue()
			} else {
				v = m.GetCounter().GetValue()
			}
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
	g.Set(v)
	return g
}

func spiffeidOf(s string) spiffeid.ID { return spiffeid.RequireFromString(s) }
