package agent

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
	"github.com/trustbridge/trustbridge/sds"
)

const rotToken = "bootstrap-token-0123456789"

var (
	rotTD       = spiffeid.RequireTrustDomainFromString("example.org")
	rotWorkload = spiffeid.RequireFromString("spiffe://example.org/ns/default/sa/web")
	rotOther    = spiffeid.RequireFromString("spiffe://example.org/ns/default/sa/other")
	rotServerID = spiffeid.RequireFromPath(rotTD, caclient.ServerPath)
)

// rotCertService is an IstioCertificateService on loopback TLS: the
// bearer token rotToken authenticates as rotWorkload, and so does any
// X509-SVID of its CA (as its own identity). It signs the CSR's key,
// valid from the fake clock's now for the lifetime asked (default 1h).
type rotCertService struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer
	ca    *testca.CA
	clock *clocktesting.FakeClock
	addr  string

	mu      sync.Mutex
	fail    codes.Code  // answer with this code when not OK
	issueAs spiffeid.ID // when set, issue for this identity whatever the caller is
	// refuseRenewals, when set, refuses calls authenticated by a
	// certificate with PermissionDenied, as a server does whose renewal
	// grant was revoked; tokens still work.
	refuseRenewals bool
	auths          []string // "token" or "certificate", per call, as authenticated
	csrIDs         []string // the URI SAN of each CSR, "" for none

	// trust is what the real SDS server next to the fake hands out: the
	// CA's roots for example.org, and federated roots tests add.
	trust *sds.TrustCell
}

func startRotCertService(t *testing.T, fc *clocktesting.FakeClock) *rotCertService {
	t.Helper()
	f := &rotCertService{ca: testca.New(t, "example.org"), clock: fc}
	leaf, key := f.ca.Issue(t, rotServerID)
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}},
		ClientAuth:   tls.RequestClientCert,
	})))
	securityv1alpha1.RegisterIstioCertificateServiceServer(gs, f)
	// The trust that comes with a certificate is fetched from SDS on the
	// same listener, authenticated by the new certificate, as from a
	// trustbridge server.
	f.trust = sds.NewTrustCell()
	require.NoError(t, f.trust.Set([]*x509bundle.Bundle{x509bundle.FromX509Authorities(rotTD, []*x509.Certificate{f.ca.Cert})}))
	sdsSrv, err := sds.New(sds.Config{
		TrustDomain:   rotTD,
		Trust:         f.trust,
		Authenticator: authn.NewX509SVID(rotTD, x509bundle.FromX509Authorities(rotTD, []*x509.Certificate{f.ca.Cert}), fc),
		Clock:         fc,
	})
	require.NoError(t, err)
	sdsSrv.Register(gs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f.addr = ln.Addr().String()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(ln)
	}()
	t.Cleanup(func() {
		gs.Stop()
		<-done
	})
	return f
}

func (f *rotCertService) set(fail codes.Code, issueAs spiffeid.ID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail, f.issueAs = fail, issueAs
}

func (f *rotCertService) calls() (auths, csrIDs []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.auths...), append([]string(nil), f.csrIDs...)
}

func (f *rotCertService) CreateCertificate(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clock.Now()
	var (
		id   spiffeid.ID
		auth string
	)
	md, _ := metadata.FromIncomingContext(ctx)
	if h := md.Get("authorization"); len(h) > 0 {
		if len(h) != 1 || h[0] != "Bearer "+rotToken {
			f.auths = append(f.auths, "bad token")
			return nil, status.Error(codes.Unauthenticated, "unknown token")
		}
		id, auth = rotWorkload, "token"
	} else if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			var err error
			id, _, err = x509svid.Verify(ti.State.PeerCertificates, x509bundle.FromX509Authorities(rotTD, []*x509.Certificate{f.ca.Cert}), x509svid.WithTime(now))
			if err != nil {
				f.auths = append(f.auths, "bad certificate")
				return nil, status.Error(codes.Unauthenticated, "certificate: "+err.Error())
			}
			auth = "certificate"
		}
	}
	if id.IsZero() {
		f.auths = append(f.auths, "none")
		return nil, status.Error(codes.Unauthenticated, "no credentials")
	}
	f.auths = append(f.auths, auth)
	if f.refuseRenewals && auth == "certificate" {
		return nil, status.Error(codes.PermissionDenied, "renewal refused: the bootstrap token that granted this identity was removed")
	}
	b, _ := pem.Decode([]byte(req.GetCsr()))
	if b == nil {
		return nil, status.Error(codes.InvalidArgument, "no CSR")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	csrID := ""
	if len(csr.URIs) > 0 {
		csrID = csr.URIs[0].String()
	}
	f.csrIDs = append(f.csrIDs, csrID)
	if f.fail != codes.OK {
		return nil, status.Error(f.fail, "injected failure")
	}
	if csrID != "" && csrID != id.String() {
		return nil, status.Error(codes.PermissionDenied, "not your identity")
	}
	if !f.issueAs.IsZero() {
		id = f.issueAs
	}
	ttl := time.Hour
	if v := req.GetValidityDuration(); v > 0 {
		ttl = time.Duration(v) * time.Second
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    now,
		NotAfter:     now.Add(ttl),
		URIs:         []*url.URL{id.URL()},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}, f.ca.Cert, csr.PublicKey, f.ca.Key)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &securityv1alpha1.IstioCertificateResponse{CertChain: []string{
		string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		string(caclient.EncodeCerts([]*x509.Certificate{f.ca.Cert})),
	}}, nil
}

// rotFixture is a fake certificate service, a fake clock, and what a
// Rotator logs and counts.
type rotFixture struct {
	svc   *rotCertService
	clock *clocktesting.FakeClock
	logs  *testlog.Buffer
	reg   *prometheus.Registry
	token string // path of a file holding rotToken
}

func newRotFixture(t *testing.T) *rotFixture {
	t.Helper()
	fc := clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	token := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(token, []byte(rotToken+"\n"), 0o600))
	return &rotFixture{svc: startRotCertService(t, fc), clock: fc, logs: &testlog.Buffer{}, reg: prometheus.NewRegistry(), token: token}
}

// config is a RotatorConfig for the fixture; mutate adjusts it.
func (f *rotFixture) config(mutate func(*RotatorConfig)) RotatorConfig {
	cfg := RotatorConfig{
		CAAddr:     f.svc.addr,
		Roots:      []*x509.Certificate{f.svc.ca.Cert},
		TokenFile:  f.token,
		TTL:        time.Hour,
		Clock:      f.clock,
		Logger:     slog.New(slog.NewTextHandler(f.logs, nil)),
		Registerer: f.reg,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	return cfg
}

func (f *rotFixture) rotator(t *testing.T, mutate func(*RotatorConfig)) *Rotator {
	t.Helper()
	r, err := NewRotator(f.config(mutate))
	require.NoError(t, err)
	return r
}

func (f *rotFixture) requests(auth, result string) float64 {
	mfs, err := f.reg.Gather()
	if err != nil {
		return -1
	}
	for _, mf := range mfs {
		if mf.GetName() != "trustbridge_agent_certificate_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["auth"] == auth && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// current is the credential the cell serves.
func current(t *testing.T, r *Rotator) *sds.Credential {
	t.Helper()
	require.NotNil(t, r.Cell())
	c, err := r.Cell().Credential(t.Context(), r.ID())
	require.NoError(t, err)
	return c
}

// writeIssued writes a certificate for id of ca, valid as opts say, into
// dir as the Rotator would.
func writeIssued(t *testing.T, dir string, ca *testca.CA, id spiffeid.ID, opts testca.Options) *x509.Certificate {
	t.Helper()
	leaf, key := ca.Issue(t, id, opts)
	require.NoError(t, caclient.WriteCredentials(dir, key, []*x509.Certificate{leaf}, caclient.Trust{TrustDomain: ca.TrustDomain, Local: []*x509.Certificate{ca.Cert}}))
	return leaf
}

// checkDir checks the credential files in dir hold cred, key 0600.
func checkDir(t *testing.T, dir string, cred *sds.Credential) {
	t.Helper()
	info, err := os.Stat(filepath.Join(dir, caclient.KeyFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	cert, id, err := caclient.LoadCertDir(dir, cred.Chain[0].NotBefore)
	require.NoError(t, err)
	assert.Equal(t, rotWorkload, id)
	assert.Equal(t, cred.Chain[0].Raw, cert.Leaf.Raw)
	assert.True(t, cred.Key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(cert.PrivateKey.(crypto.Signer).Public()), "the key of the certificate")
}

func TestNewRotatorRefusals(t *testing.T) {
	f := newRotFixture(t)
	plain := testca.New(t, "example.org", testca.Options{Mutate: func(c *x509.Certificate) { c.URIs = nil }}).Cert
	tests := []struct {
		name   string
		mutate func(*RotatorConfig)
		err    string
	}{
		{"no address", func(c *RotatorConfig) { c.CAAddr = "" }, "no certificate service address"},
		{"no roots", func(c *RotatorConfig) { c.Roots = nil }, "no roots"},
		{"nil root", func(c *RotatorConfig) { c.Roots = []*x509.Certificate{nil} }, "no roots"},
		{"no way to authenticate", func(c *RotatorConfig) { c.TokenFile = "" }, "nothing to authenticate the first request with"},
		{"grace ratio 1", func(c *RotatorConfig) { c.GraceRatio = 1 }, "grace ratio"},
		{"negative grace ratio", func(c *RotatorConfig) { c.GraceRatio = -0.1 }, "grace ratio"},
		{"negative ttl", func(c *RotatorConfig) { c.TTL = -time.Hour }, "ttl"},
		{"fractional ttl", func(c *RotatorConfig) { c.TTL = 1500 * time.Millisecond }, "ttl"},
		{"server trust domain unknown", func(c *RotatorConfig) { c.Roots = []*x509.Certificate{plain} }, "cannot tell the server's trust domain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := f.config(tt.mutate)
			cfg.Registerer = nil
			_, err := NewRotator(cfg)
			assert.ErrorContains(t, err, tt.err)
			assert.ErrorContains(t, err, "rotator: ")
		})
	}
	// With an output directory, the certificate there may still tell.
	_, err := NewRotator(f.config(func(c *RotatorConfig) { c.Roots = []*x509.Certificate{plain}; c.OutputCertsDir = t.TempDir() }))
	assert.NoError(t, err)
}

func TestRotatorBeforeInit(t *testing.T) {
	f := newRotFixture(t)
	r := f.rotator(t, nil)
	assert.Nil(t, r.Cell())
	assert.True(t, r.ID().IsZero())
	assert.True(t, r.NotAfter().IsZero())
	assert.ErrorContains(t, r.Run(t.Context()), "before a successful Init")
}

func TestRotatorInitByToken(t *testing.T) {
	f := newRotFixture(t)
	out := filepath.Join(t.TempDir(), "out")
	r := f.rotator(t, func(c *RotatorConfig) { c.OutputCertsDir = out })
	require.NoError(t, r.Init(t.Context()))

	assert.Equal(t, rotWorkload, r.ID())
	cred := current(t, r)
	assert.True(t, f.clock.Now().Add(time.Hour).Equal(cred.Chain[0].NotAfter), "the TTL asked for")
	assert.True(t, cred.Chain[0].NotAfter.Equal(r.NotAfter()))
	assert.Len(t, cred.Chain, 1, "no roots in the chain")
	auths, csrIDs := f.svc.calls()
	assert.Equal(t, []string{"token"}, auths)
	assert.Equal(t, []string{""}, csrIDs, "the token decides the identity")
	checkDir(t, out, cred)
	roots, err := caclient.ReadPEMCerts(filepath.Join(out, caclient.RootsFile))
	require.NoError(t, err)
	assert.Equal(t, []*x509.Certificate{f.svc.ca.Cert}, roots)
	assert.Equal(t, 1.0, f.requests("token", "success"))
	assert.Equal(t, float64(r.NotAfter().Unix()), testutil.ToFloat64(r.metrics.notAfter))
	assert.NotContains(t, f.logs.String(), rotToken)
}

// A still-valid certificate in OutputCertsDir authenticates the first
// request instead of the token; an expired or refused one falls back to
// the token when there is one.
func TestRotatorInitFromOutputCertsDir(t *testing.T) {
	tests := []struct {
		name     string
		cert     string // "", "valid", "expired", "foreign"
		token    bool
		auths    []string
		csrIDs   []string
		err      string
		logEntry string
	}{
		{name: "nothing there: token", token: true, auths: []string{"token"}, csrIDs: []string{""}},
		{name: "valid certificate", cert: "valid", token: true, auths: []string{"certificate"}, csrIDs: []string{rotWorkload.String()}},
		{name: "valid certificate, no token", cert: "valid", auths: []string{"certificate"}, csrIDs: []string{rotWorkload.String()}},
		{name: "expired certificate: token", cert: "expired", token: true, auths: []string{"token"}, csrIDs: []string{""}, logEntry: "expired at"},
		{name: "refused certificate: token", cert: "foreign", token: true, auths: []string{"bad certificate", "token"}, csrIDs: []string{""}, logEntry: "did not accept the credentials"},
		{name: "expired certificate, no token", cert: "expired", err: "no valid certificate in"},
		{name: "nothing, no token", err: "no credential to authenticate"},
		{name: "refused certificate, no token", cert: "foreign", auths: []string{"bad certificate"}, err: "did not accept the credentials"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newRotFixture(t)
			dir := t.TempDir()
			now := f.clock.Now()
			switch tt.cert {
			case "valid":
				writeIssued(t, dir, f.svc.ca, rotWorkload, testca.Options{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)})
			case "expired":
				writeIssued(t, dir, f.svc.ca, rotWorkload, testca.Options{NotBefore: now.Add(-2 * time.Hour), NotAfter: now.Add(-time.Hour)})
			case "foreign":
				writeIssued(t, dir, testca.New(t, "example.org"), rotWorkload, testca.Options{})
			}
			r := f.rotator(t, func(c *RotatorConfig) {
				c.OutputCertsDir = dir
				if !tt.token {
					c.TokenFile = ""
				}
			})
			err := r.Init(t.Context())
			auths, csrIDs := f.svc.calls()
			assert.Equal(t, tt.auths, auths)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				assert.Nil(t, r.Cell())
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.csrIDs, csrIDs)
			assert.Equal(t, rotWorkload, r.ID())
			checkDir(t, dir, current(t, r))
			if tt.logEntry != "" {
				assert.Contains(t, f.logs.String(), tt.logEntry)
			}
		})
	}
}

// Permanent refusals return at once; transient failures are retried with
// backoff until they pass or ctx is done.
func TestRotatorInitErrors(t *testing.T) {
	tests := []struct {
		name     string
		code     codes.Code
		failures int // calls that fail before the service recovers; -1: all
		calls    int
		err      string
	}{
		{name: "unauthenticated", code: codes.Unauthenticated, failures: -1, calls: 1, err: "did not accept the credentials"},
		{name: "permission denied", code: codes.PermissionDenied, failures: -1, calls: 1, err: "refused to issue this identity"},
		{name: "invalid argument", code: codes.InvalidArgument, failures: -1, calls: 1, err: "refused the request"},
		{name: "internal", code: codes.Internal, failures: -1, calls: 1, err: "Internal"},
		{name: "unavailable, then up", code: codes.Unavailable, failures: 3, calls: 4},
		{name: "rate limited, then up", code: codes.ResourceExhausted, failures: 1, calls: 2},
		{name: "deadline, then up", code: codes.DeadlineExceeded, failures: 2, calls: 3},
		{name: "unavailable until cancelled", code: codes.Unavailable, failures: -1, calls: 3, err: "giving up"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newRotFixture(t)
			r := f.rotator(t, nil)
			f.svc.set(tt.code, spiffeid.ID{})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			attempts := 0
			// Called on Init's goroutine, after the retry time is fixed:
			// stepping the clock past it lets the retry run now.
			r.afterAttempt = func(err error) {
				attempts++
				if err == nil {
					return
				}
				if tt.failures < 0 && attempts == tt.calls {
					cancel()
				}
				if attempts == tt.failures {
					f.svc.set(codes.OK, spiffeid.ID{})
				}
				f.clock.Step(r.retry.Max)
			}
			err := r.Init(ctx)
			auths, _ := f.svc.calls()
			assert.Len(t, auths, tt.calls)
			if tt.err != "" {
				require.Error(t, err)
				assert.ErrorContains(t, err, tt.err)
				assert.ErrorContains(t, err, "rotator: ")
				assert.Nil(t, r.Cell())
				assert.Equal(t, float64(tt.calls), f.requests("token", "failure"))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, rotWorkload, r.ID())
			assert.Equal(t, float64(tt.failures), f.requests("token", "failure"))
			assert.Equal(t, 1.0, f.requests("token", "success"))
			assert.Contains(t, f.logs.String(), "retrying")
		})
	}
}

// A wrong token file is a permanent error, and its content is not logged.
func TestRotatorInitBadTokenFile(t *testing.T) {
	f := newRotFixture(t)
	r := f.rotator(t, func(c *RotatorConfig) { c.TokenFile = filepath.Join(t.TempDir(), "missing") })
	assert.ErrorContains(t, r.Init(t.Context()), "token file")
	auths, _ := f.svc.calls()
	assert.Empty(t, auths)
}

// runRotator starts Run with a hook reporting every attempt, and stops it
// at the end of the test.
func runRotator(t *testing.T, r *Rotator) <-chan error {
	t.Helper()
	attempts := make(chan error, 16)
	r.afterAttempt = func(err error) { attempts <- err }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	return attempts
}

func waitClosed(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatal("the credential did not change")
	}
}

func nextAttempt(t *testing.T, attempts <-chan error) error {
	t.Helper()
	select {
	case err := <-attempts:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("no rotation attempt")
		return nil
	}
}

// At the grace point the Rotator renews with a new key, authenticated by
// its current certificate, publishes it and writes it out.
func TestRotatorRotates(t *testing.T) {
	f := newRotFixture(t)
	out := t.TempDir()
	r := f.rotator(t, func(c *RotatorConfig) { c.OutputCertsDir = out; c.GraceRatio = 0.75 })
	require.NoError(t, r.Init(t.Context()))
	first := current(t, r)
	attempts := runRotator(t, r)

	f.clock.Step(44 * time.Minute) // before the grace point at 45m
	select {
	case <-first.Changed:
		t.Fatal("rotated before the grace point")
	default:
	}
	f.clock.Step(time.Minute)
	require.NoError(t, nextAttempt(t, attempts))
	waitClosed(t, first.Changed)
	second := current(t, r)
	assert.NotEqual(t, first.Chain[0].SerialNumber, second.Chain[0].SerialNumber)
	assert.False(t, first.Key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(second.Key.Public()), "a new key")
	assert.Equal(t, rotWorkload, r.ID())
	assert.True(t, second.Chain[0].NotAfter.Equal(r.NotAfter()))
	auths, csrIDs := f.svc.calls()
	assert.Equal(t, []string{"token", "certificate"}, auths)
	assert.Equal(t, []string{"", rotWorkload.String()}, csrIDs, "renewal asks for the same identity")
	checkDir(t, out, second)
	assert.Equal(t, 1.0, f.requests("certificate", "success"))

	// And again, from the new certificate's grace point.
	f.clock.Step(45 * time.Minute)
	require.NoError(t, nextAttempt(t, attempts))
	waitClosed(t, second.Changed)
	assert.Equal(t, 2.0, f.requests("certificate", "success"))
}

// A failed renewal keeps the current credential, is logged and counted,
// and is retried with backoff; an answer for another identity is refused
// the same way.
func TestRotatorRenewalFailureKeepsCredential(t *testing.T) {
	tests := []struct {
		name    string
		code    codes.Code
		issueAs spiffeid.ID
		err     string
	}{
		{name: "unavailable", code: codes.Unavailable, err: "cannot reach the CA"},
		{name: "refused", code: codes.PermissionDenied, err: "refused to issue"},
		{name: "another identity", issueAs: rotOther, err: "issued " + rotOther.String() + ", asked for " + rotWorkload.String()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newRotFixture(t)
			out := t.TempDir()
			r := f.rotator(t, func(c *RotatorConfig) { c.OutputCertsDir = out })
			require.NoError(t, r.Init(t.Context()))
			first := current(t, r)
			attempts := runRotator(t, r)

			f.svc.set(tt.code, tt.issueAs)
			f.clock.Step(30 * time.Minute)
			err := nextAttempt(t, attempts)
			assert.ErrorContains(t, err, tt.err)
			assert.Same(t, first, current(t, r), "the current credential stays")
			assert.Equal(t, rotWorkload, r.ID())
			checkDir(t, out, first)
			assert.Contains(t, f.logs.String(), "keeping the current one")
			assert.Contains(t, f.logs.String(), tt.err)
			assert.Equal(t, 1.0, f.requests("certificate", "failure"))

			f.svc.set(codes.OK, spiffeid.ID{})
			f.clock.Step(r.retry.Max)
			require.NoError(t, nextAttempt(t, attempts))
			waitClosed(t, first.Changed)
			checkDir(t, out, current(t, r))
		})
	}
}

// A renewal the server refuses (its grant was revoked, or the chain reached
// --max-renewal-lifetime) falls back to the token at once, while the
// current certificate is still valid, not after it expired.
func TestRotatorRefusedRenewalUsesToken(t *testing.T) {
	f := newRotFixture(t)
	r := f.rotator(t, nil)
	require.NoError(t, r.Init(t.Context()))
	first := current(t, r)
	attempts := runRotator(t, r)

	f.svc.mu.Lock()
	f.svc.refuseRenewals = true
	f.svc.mu.Unlock()
	f.clock.Step(30 * time.Minute) // the grace point, long before NotAfter
	require.NoError(t, nextAttempt(t, attempts))
	waitClosed(t, first.Changed)
	auths, csrIDs := f.svc.calls()
	assert.Equal(t, []string{"token", "certificate", "token"}, auths)
	assert.Equal(t, []string{"", rotWorkload.String()}, csrIDs, "the token renews the same identity (the refused call's CSR was not read)")
	assert.Contains(t, f.logs.String(), "refused to renew with the current certificate; using the token")
	assert.Equal(t, 1.0, f.requests("certificate", "failure"))
	assert.Equal(t, 2.0, f.requests("token", "success"))
}

// Once the current certificate has expired (renewals failed until then),
// the Rotator falls back to the token, still for the same identity.
func TestRotatorExpiredFallsBackToToken(t *testing.T) {
	f := newRotFixture(t)
	r := f.rotator(t, nil)
	require.NoError(t, r.Init(t.Context()))
	first := current(t, r)
	attempts := runRotator(t, r)

	f.svc.set(codes.Unavailable, spiffeid.ID{})
	f.clock.Step(30 * time.Minute)
	require.Error(t, nextAttempt(t, attempts))
	f.svc.set(codes.OK, spiffeid.ID{})
	f.clock.Step(time.Hour)
	require.NoError(t, nextAttempt(t, attempts))
	waitClosed(t, first.Changed)
	auths, csrIDs := f.svc.calls()
	assert.Equal(t, []string{"token", "certificate", "token"}, auths)
	assert.Equal(t, rotWorkload.String(), csrIDs[2], "the token renews the same identity")
}

// Without a token, an expired certificate cannot be renewed: the error
// says so and the credential stays.
func TestRotatorExpiredWithoutToken(t *testing.T) {
	f := newRotFixture(t)
	dir := t.TempDir()
	now := f.clock.Now()
	writeIssued(t, dir, f.svc.ca, rotWorkload, testca.Options{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)})
	r := f.rotator(t, func(c *RotatorConfig) { c.TokenFile = ""; c.OutputCertsDir = dir })
	require.NoError(t, r.Init(t.Context()))
	first := current(t, r)
	attempts := runRotator(t, r)

	f.clock.Step(2 * time.Hour)
	assert.ErrorContains(t, nextAttempt(t, attempts), "expired at")
	assert.Same(t, first, current(t, r))
	assert.Contains(t, f.logs.String(), "there is no token file")
}

// ClientTLS presents the current certificate and verifies the server
// against the current server roots.
func TestRotatorClientTLS(t *testing.T) {
	f := newRotFixture(t)
	r := f.rotator(t, nil)
	cfg := r.ClientTLS()
	serving, _ := f.svc.ca.Issue(t, rotServerID)
	imposter, _ := f.svc.ca.Issue(t, rotWorkload)
	other := testca.New(t, "example.org")
	otherServing, _ := other.Issue(t, rotServerID)
	verify := func(leaf *x509.Certificate) error {
		return cfg.VerifyConnection(tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}})
	}

	c, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
	require.NoError(t, err)
	assert.Empty(t, c.Certificate, "no certificate before Init")
	require.NoError(t, r.Init(t.Context()))
	c, err = cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
	require.NoError(t, err)
	assert.Equal(t, current(t, r).Chain[0].Raw, c.Certificate[0])

	assert.NoError(t, verify(serving))
	assert.ErrorContains(t, verify(imposter), "want "+rotServerID.String())
	assert.ErrorContains(t, verify(otherServing), "does not verify")

	r.SetServerRoots(nil) // ignored
	assert.NoError(t, verify(serving))
	r.SetServerRoots([]*x509.Certificate{other.Cert})
	assert.NoError(t, verify(otherServing), "the new roots apply to the next handshake")
	assert.ErrorContains(t, verify(serving), "does not verify")

	// A handshake over the network, presenting the rotated certificate.
	r.SetServerRoots([]*x509.Certificate{f.svc.ca.Cert})
	conn, err := tls.Dial("tcp", f.svc.addr, cfg)
	require.NoError(t, err)
	assert.Equal(t, rotServerID.URL().String(), conn.ConnectionState().PeerCertificates[0].URIs[0].String())
	require.NoError(t, conn.Close())
}

func TestGracePoint(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		ratio float64
		na    time.Time
		want  time.Time
	}{
		{0.5, nb.Add(time.Hour), nb.Add(30 * time.Minute)},
		{0.75, nb.Add(time.Hour), nb.Add(45 * time.Minute)},
		{0.5, nb.Add(24 * time.Hour), nb.Add(12 * time.Hour)},
		{0.5, nb, nb},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, gracePoint(nb, tt.na, tt.ratio), "%v of %s", tt.ratio, tt.na.Sub(nb))
	}
}

// sleepUntil returns at once for a time already reached, and on ctx.
func TestSleepUntil(t *testing.T) {
	fc := clocktesting.NewFakeClock(time.Now())
	assert.True(t, sleepUntil(t.Context(), fc, fc.Now()))
	assert.True(t, sleepUntil(t.Context(), fc, fc.Now().Add(-time.Second)))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	assert.False(t, sleepUntil(ctx, fc, fc.Now().Add(time.Hour)))
	assert.False(t, fc.HasWaiters(), "timers stopped")
}

// A provisioning certificate (Istio's PROV_CERT) authenticates the first
// request when the output directory holds none; it is only read, and a
// valid certificate in the output directory goes first.
func TestRotatorInitFromProvCertDir(t *testing.T) {
	for _, tc := range []struct {
		name     string
		outValid bool
		auths    []string
	}{
		{name: "provisioning certificate", auths: []string{"certificate"}},
		{name: "output directory first", outValid: true, auths: []string{"certificate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newRotFixture(t)
			now := f.clock.Now()
			prov, out := t.TempDir(), t.TempDir()
			valid := testca.Options{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}
			provLeaf := writeIssued(t, prov, f.svc.ca, rotWorkload, valid)
			if tc.outValid {
				writeIssued(t, out, f.svc.ca, rotWorkload, valid)
			}
			r := f.rotator(t, func(c *RotatorConfig) { c.OutputCertsDir, c.ProvCertDir, c.TokenFile = out, prov, "" })
			require.NoError(t, r.Init(t.Context()))
			auths, _ := f.svc.calls()
			assert.Equal(t, tc.auths, auths)
			checkDir(t, out, current(t, r))
			cert, _, err := caclient.LoadCertDir(prov, now)
			require.NoError(t, err)
			assert.Equal(t, provLeaf.Raw, cert.Leaf.Raw, "the provisioning directory is never written")
		})
	}
	_, err := NewRotator(newRotFixture(t).config(func(c *RotatorConfig) { c.TokenFile = "" }))
	assert.ErrorContains(t, err, "nothing to authenticate the first request with")
}

// A certificate service of another trust domain than the one the agent
// expects ends Init at the first handshake, saying so, instead of
// retrying for ever as if it were unreachable.
func TestRotatorInitServerOfAnotherTrustDomain(t *testing.T) {
	f := newRotFixture(t)
	want := spiffeid.RequireFromString("spiffe://other.org/trustbridge/ca")
	r := f.rotator(t, func(c *RotatorConfig) { c.ServerID = want })
	err := r.Init(t.Context())
	require.ErrorIs(t, err, caclient.ErrServerTrustDomain)
	assert.EqualError(t, err, "rotator: certificate service of another trust domain: the server presents spiffe://example.org/trustbridge/ca, "+
		"an identity of example.org, not of other.org: point this client at other.org's certificate service, "+
		"or give it example.org's roots and trust domain")
	assert.NotContains(t, f.logs.String(), "retrying")
}
