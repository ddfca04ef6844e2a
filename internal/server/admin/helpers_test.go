package admin

import (
	"context"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var (
	localTD = spiffeid.RequireTrustDomainFromString("example.org")
	peerTD  = spiffeid.RequireTrustDomainFromString("peer.example")
	// t0 is the fake clock's start.
	t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
)

// fakeCA is a CA with one active root and one prepared successor.
type fakeCA struct {
	bundle *spiffebundle.Bundle
	roots  []ca.RootInfo
}

func newFakeCA(t *testing.T) *fakeCA {
	t.Helper()
	active, next := testca.New(t, localTD.Name()), testca.New(t, localTD.Name())
	b := spiffebundle.FromX509Authorities(localTD, []*x509.Certificate{active.Cert, next.Cert})
	b.SetSequenceNumber(7)
	b.SetRefreshHint(5 * time.Minute)
	return &fakeCA{bundle: b, roots: []ca.RootInfo{
		{RootRecord: castate.RootRecord{ID: "01", State: castate.StateActive, CertSHA256: "aa",
			PreparedAt: t0.Add(-48 * time.Hour), ActivatedAt: t0.Add(-24 * time.Hour)}, Cert: active.Cert},
		{RootRecord: castate.RootRecord{ID: "02", State: castate.StatePrepared, CertSHA256: "bb",
			PreparedAt: t0.Add(-time.Hour)}, Cert: next.Cert},
	}}
}

func (c *fakeCA) Bundle() *spiffebundle.Bundle { return c.bundle }
func (c *fakeCA) Roots() []ca.RootInfo         { return c.roots }
func (c *fakeCA) Sequence() uint64             { seq, _ := c.bundle.SequenceNumber(); return seq }

// fakeFederation federates with peer.example and records refreshes.
type fakeFederation struct {
	err error // Refresh's answer

	mu        sync.Mutex
	refreshed []spiffeid.TrustDomain
}

func (f *fakeFederation) Status() []federation.Status {
	seq := uint64(3)
	last := t0.Add(-time.Minute)
	return []federation.Status{{
		TrustDomain: peerTD.Name(), EndpointURL: "https://peer.example/bundle", Profile: federation.ProfileHTTPSWeb,
		State: federation.StateOK, Sequence: &seq, LastAttempt: &last, LastSuccess: &last, Authorities: []federation.AuthorityInfo{},
	}}
}

func (f *fakeFederation) Refresh(_ context.Context, td spiffeid.TrustDomain) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refreshed = append(f.refreshed, td)
	return f.err
}

func (f *fakeFederation) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.refreshed)
}

// fixture is an admin API over fakes, a fake clock and a trust store
// holding the CA's bundle and the peer's.
type fixture struct {
	cfg   Config
	ca    *fakeCA
	fed   *fakeFederation
	clock *clocktesting.FakeClock
	peer  *testca.CA
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{ca: newFakeCA(t), fed: &fakeFederation{}, clock: clocktesting.NewFakeClock(t0), peer: testca.New(t, peerTD.Name())}
	store := trust.NewStore()
	store.Set("ca", f.ca.bundle)
	peer := f.peer.Bundle()
	peer.SetSequenceNumber(3)
	store.Set("federation:"+peerTD.Name(), peer)
	f.cfg = Config{
		TrustDomain: localTD, CA: f.ca, Gatherer: prometheus.NewRegistry(), Federation: f.fed, Trust: store,
		Origin: func(td spiffeid.TrustDomain) string { return map[spiffeid.TrustDomain]string{peerTD: "file"}[td] },
		Actor:  "replica-0", Clock: f.clock,
	}
	return f
}

// do sends one request to New(cfg) and returns the recorded answer.
func do(t *testing.T, h http.Handler, method, target string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func body(t *testing.T, rec *httptest.ResponseRecorder) string {
	t.Helper()
	b, err := io.ReadAll(rec.Result().Body)
	require.NoError(t, err)
	return string(b)
}

// refresh POSTs an operator refresh of td as the CLI does.
func refresh(t *testing.T, h http.Handler, td string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	return do(t, h, http.MethodPost, "/v1/federation/refresh?trust_domain="+url.QueryEscape(td), header...)
}
