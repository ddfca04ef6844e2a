package agent

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"log/slog"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// testTaints is a certservice.TaintSource the test sets, standing in for
// the CA's taint API.
type testTaints struct {
	mu      sync.Mutex
	set     []certservice.Tainted
	changed chan struct{}
}

func (s *testTaints) Tainted() ([]certservice.Tainted, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.set, s.changed
}

func (s *testTaints) taint(ts ...certservice.Tainted) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.set = ts
	close(s.changed)
	s.changed = make(chan struct{})
}

// movingSigner signs workloads' certificates with the CA until moved to
// a second one, as a CA that switched off a tainted authority; the
// node's own certificate stays with the CA.
type movingSigner struct {
	authority *ca.Authority
	t         testing.TB

	mu   sync.Mutex
	next *testca.CA
}

func (m *movingSigner) SignX509SVID(p ca.X509SVIDParams) (*ca.Issued, error) {
	m.mu.Lock()
	next := m.next
	m.mu.Unlock()
	if next == nil || p.SPIFFEID == nodeID {
		return m.authority.SignX509SVID(p)
	}
	leaf := testca.Sign(m.t, &x509.Certificate{
		SerialNumber: serial(m.t), NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{p.SPIFFEID.URL()}, DNSNames: p.DNSNames,
	}, next.Cert, p.PublicKey, next.Key)
	return &ca.Issued{Leaf: leaf, Chain: []*x509.Certificate{leaf, next.Cert}, Roots: []*x509.Certificate{next.Cert}}, nil
}

func (m *movingSigner) move(to *testca.CA) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.next = to
}

// A taint of the root that signed a workload's X509-SVID reaches the node
// agent through the real certificate service's WatchBundles, and the
// workload's Workload API client sees a new X509-SVID from the CA's other
// authority within the spread, without asking.
func TestNodeModeTaintReissues(t *testing.T) {
	taints := &testTaints{changed: make(chan struct{})}
	logs := &testlog.Buffer{}
	var signer *movingSigner
	f := startNodeFixtureOn(t, func(cfg *certservice.Config, authority *ca.Authority) {
		signer = &movingSigner{authority: authority, t: t}
		cfg.Signer, cfg.Taints, cfg.ReissueSpread = signer, taints, time.Second
	}, func(cfg *Config) { cfg.Logger = slog.New(slog.NewTextHandler(logs, nil)) }, webID, webID)
	waitSocket(t, f.wl, f.done)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c, err := workloadapi.New(ctx, workloadapi.WithAddr(endpointSocket(f.wl)))
	require.NoError(t, err)
	defer c.Close()
	first, err := c.FetchX509SVID(ctx)
	require.NoError(t, err)
	old := f.cs.authority.Bundle().X509Authorities()[0]
	require.Equal(t, old.SubjectKeyId, first.Certificates[0].AuthorityKeyId)

	// The CA publishes its next authority, then taints the old one and
	// signs with the next.
	next := testca.New(t, tdA.Name())
	local := spiffebundle.FromX509Authorities(tdA, []*x509.Certificate{old, next.Cert})
	f.fed.replace(local)
	require.NoError(t, f.cs.local.Set([]*x509bundle.Bundle{local.X509Bundle()}))
	require.Eventually(t, func() bool {
		x, err := c.FetchX509Bundles(ctx)
		if err != nil {
			return false
		}
		b, ok := x.Get(tdA)
		return ok && b.HasX509Authority(next.Cert)
	}, 30*time.Second, 20*time.Millisecond, "the next authority is published")
	signer.move(next)
	taints.taint(certservice.Tainted{X509SubjectKeyID: old.SubjectKeyId, X509SHA256: hexSHA256(old.Raw), At: time.Now()})

	require.Eventually(t, func() bool {
		svid, err := c.FetchX509SVID(ctx)
		return err == nil && string(svid.Certificates[0].AuthorityKeyId) == string(next.Cert.SubjectKeyId)
	}, 30*time.Second, 50*time.Millisecond, "the workload is re-issued from the next authority:\n%s", logs)
	svid, err := c.FetchX509SVID(ctx)
	require.NoError(t, err)
	assert.Equal(t, webID, svid.ID)
	assert.NotEqual(t, first.Certificates[0].SerialNumber, svid.Certificates[0].SerialNumber)
}

// An agent without a Workload API follows WatchBundles for the taints
// alone: its own certificate, which the tainted root signed, is
// re-issued within the spread.
func TestRunCAFollowsTaints(t *testing.T) {
	taints := &testTaints{changed: make(chan struct{})}
	cs := newCertServiceWith(t, func(cfg *certservice.Config, authority *ca.Authority) {
		cfg.Bundles = certservice.BundleSourceFunc(func() ([]*spiffebundle.Bundle, <-chan struct{}) {
			return []*spiffebundle.Bundle{authority.Bundle()}, nil
		})
		cfg.Taints, cfg.ReissueSpread = taints, time.Second
		// The agent watches with its certificate, as against a server.
		cfg.Authenticator = authn.Chain{cfg.Authenticator, authn.NewX509SVID(tdA, authority.Bundle().X509Bundle(), nil)}
		cfg.Grants = map[string]authn.GrantChecker{authn.MethodKubernetesJWT: authn.GrantCheckerFunc(func(context.Context, spiffeid.ID, authn.Grant) error { return nil })}
	})
	dir := shortDir(t)
	token := filepath.Join(dir, "token")
	writeFile(t, token, []byte(nodeToken+"\n"))
	logs := &testlog.Buffer{}
	a := newTestAgent(t, Config{
		SocketPath: filepath.Join(dir, "sds.sock"), CredentialsDir: filepath.Join(dir, "creds"),
		Rotator: &RotatorConfig{CAAddr: cs.addr, Roots: cs.authority.Bundle().X509Authorities(), ServerID: serverID, TokenFile: token},
		Logger:  slog.New(slog.NewTextHandler(logs, nil)),
	})
	_, done := runAgent(t, a)
	waitSocket(t, filepath.Join(dir, "sds.sock"), done)

	root := cs.authority.Bundle().X509Authorities()[0]
	taints.taint(certservice.Tainted{X509SubjectKeyID: root.SubjectKeyId, X509SHA256: hexSHA256(root.Raw)})
	require.Eventually(t, func() bool { return testutil.ToFloat64(a.metrics.taintReissues) >= 1 }, 30*time.Second, 20*time.Millisecond,
		"the agent's certificate is re-issued:\n%s", logs)
	assert.Contains(t, logs.String(), "credentials=1")
}

func hexSHA256(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}
