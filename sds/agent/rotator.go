package agent

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	mathrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/loop"
	"github.com/trustbridge/trustbridge/sds"
)

// defaultGraceRatio is RotatorConfig.GraceRatio when zero: rotate half-way
// through the certificate's lifetime, as the Istio agent does.
const defaultGraceRatio = 0.5

// Retry delays of the Rotator, and the deadline of one certificate
// request.
const (
	rotatorRetryBase   = time.Second
	rotatorRetryMax    = 2 * time.Minute
	rotatorCallTimeout = 30 * time.Second
)

// RotatorConfig configures a Rotator.
type RotatorConfig struct {
	// CAAddr is host:port of the certificate service (required).
	CAAddr string
	// Roots is the initial trust for the server, from --root-cert
	// (required).
	Roots []*x509.Certificate
	// ServerID is the SPIFFE ID the server must present; when zero it is
	// derived as `trustbridge ca request` derives it
	// (caclient.ExpectedServerID).
	ServerID spiffeid.ID
	// TokenFile holds a JWT or bootstrap token; it is re-read on every
	// use, so a projected token that kubelet refreshes keeps working.
	TokenFile string
	// OutputCertsDir, when set, receives every certificate issued
	// (key.pem 0600, cert-chain.pem, root-cert.pem); a still-valid
	// certificate found there at start authenticates the first request
	// by mTLS instead of the token.
	OutputCertsDir string
	// ProvCertDir, when set, holds a provisioning certificate
	// (cert-chain.pem, key.pem; Istio's PROV_CERT) that authenticates
	// the first request when OutputCertsDir holds no valid one. It is
	// only read.
	ProvCertDir string
	// GraceRatio places the rotation at NotBefore + GraceRatio*lifetime;
	// 0.5 when zero, else in (0, 1).
	GraceRatio float64
	// TTL is the lifetime to ask for, in whole seconds; zero leaves it to
	// the server.
	TTL time.Duration
	// Clock defaults to the real clock.
	Clock clock.Clock
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Registerer receives the Rotator's metrics; nil registers nowhere.
	Registerer prometheus.Registerer
}

// Rotator obtains the workload's X509-SVID from trustbridge's certificate
// service with a key it generates locally, renews it before it expires,
// and publishes it in a sds.CredentialCell. Build it with NewRotator,
// call Init, then Run.
type Rotator struct {
	addr      string
	tokenFile string
	outDir    string
	provDir   string
	grace     float64
	ttl       time.Duration
	clock     clock.Clock
	log       *slog.Logger
	metrics   *rotatorMetrics

	// retry spaces failed attempts.
	retry loop.Backoff
	// afterAttempt, when set (tests), is called after every request
	// attempt with its result, once the next attempt's time is fixed.
	afterAttempt func(error)

	mu       sync.Mutex
	roots    []*x509.Certificate // trusted for the server
	serverID spiffeid.ID         // zero until known
	cur      *tls.Certificate    // Leaf set; nil before Init
	id       spiffeid.ID         // the workload identity, fixed by Init
	cell     *sds.CredentialCell
	trust    caclient.Trust      // from the server with the last certificate
	chain    []*x509.Certificate // cur's, parsed
	// taints is the taint set in force (setTaints), taintWake a signal
	// (cap 1) that it changed; taintReissues, when set, counts the
	// re-issues taints caused.
	taints        taintSet
	taintWake     chan struct{}
	taintReissues prometheus.Counter
}

// NewRotator checks cfg and applies its defaults. It starts nothing and
// reads no file.
func NewRotator(cfg RotatorConfig) (*Rotator, error) {
	grace, err := cfg.check()
	if err != nil {
		return nil, err
	}
	serverID, err := cfg.initialServerID()
	if err != nil {
		return nil, err
	}
	r := &Rotator{
		addr:      cfg.CAAddr,
		tokenFile: cfg.TokenFile,
		outDir:    cfg.OutputCertsDir,
		provDir:   cfg.ProvCertDir,
		grace:     grace,
		ttl:       cfg.TTL,
		clock:     cfg.Clock,
		log:       cfg.Logger,
		retry:     loop.Backoff{Base: rotatorRetryBase, Max: rotatorRetryMax, Jitter: retryJitter},
		roots:     slices.Clone(cfg.Roots),
		serverID:  serverID,
		taintWake: make(chan struct{}, 1),
	}
	if r.clock == nil {
		r.clock = clock.RealClock{}
	}
	if r.log == nil {
		r.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	m, err := newRotatorMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("rotator: %w", err)
	}
	r.metrics = m
	return r, nil
}

// check refuses a config without an address, roots or a way to
// authenticate the first request, or with a grace ratio or TTL out of
// range. It returns the grace ratio to use, defaulted.
func (cfg *RotatorConfig) check() (grace float64, err error) {
	if cfg.CAAddr == "" {
		return 0, errors.New("rotator: no certificate service address")
	}
	if len(cfg.Roots) == 0 || slices.Contains(cfg.Roots, nil) {
		return 0, errors.New("rotator: no roots to verify the certificate service with")
	}
	if cfg.TokenFile == "" && cfg.OutputCertsDir == "" && cfg.ProvCertDir == "" {
		return 0, errors.New("rotator: no token file, output certificates directory or provisioning certificate directory: nothing to authenticate the first request with")
	}
	grace = cmp.Or(cfg.GraceRatio, defaultGraceRatio)
	if !(grace > 0 && grace < 1) {
		return 0, fmt.Errorf("rotator: grace ratio %v must be between 0 and 1", cfg.GraceRatio)
	}
	if cfg.TTL < 0 || cfg.TTL%time.Second != 0 {
		return 0, fmt.Errorf("rotator: ttl %s: want a whole, positive number of seconds", cfg.TTL)
	}
	return grace, nil
}

// initialServerID is the SPIFFE ID the server must present, as far as it
// is known before Init: ServerID, else derived from the roots. It may stay
// zero only when a certificate directory can tell the trust domain later.
func (cfg *RotatorConfig) initialServerID() (spiffeid.ID, error) {
	if !cfg.ServerID.IsZero() {
		return cfg.ServerID, nil
	}
	// The identity in OutputCertsDir or ProvCertDir may still tell the
	// trust domain, in Init; without them the roots must.
	id, err := caclient.ExpectedServerID(cfg.Roots, spiffeid.ID{})
	switch {
	case err == nil:
		return id, nil
	case cfg.OutputCertsDir == "" && cfg.ProvCertDir == "":
		return spiffeid.ID{}, fmt.Errorf("rotator: %w", err)
	}
	return spiffeid.ID{}, nil
}

// errNoAuth means neither a usable certificate nor a token file is there
// to authenticate with.
var errNoAuth = errors.New("no credential to authenticate to the certificate service with")

// Init obtains the first certificate: by mTLS with a still-valid
// certificate in OutputCertsDir, else (or when the server refuses that
// certificate) with the token. Transient failures (Unavailable,
// ResourceExhausted, DeadlineExceeded) are retried with capped
// exponential backoff and jitter until ctx is done; any other failure
// returns at once. After Init, Cell holds the credential.
func (r *Rotator) Init(ctx context.Context) error {
	for failures := 0; ; {
		err := r.initOnce(ctx)
		if err == nil {
			r.attempted(nil)
			return nil
		}
		retry := transient(err) && ctx.Err() == nil
		err = r.explain(err)
		if !retry {
			r.attempted(err)
			return fmt.Errorf("rotator: %w", err)
		}
		failures++
		d := r.retry.Delay(failures, mathrand.Float64())
		r.log.Warn("no workload certificate yet; retrying", logattr.Address, r.addr,
			logattr.Error, err.Error(), "retry_in", d)
		at := r.clock.Now().Add(d)
		r.attempted(err)
		if !sleepUntil(ctx, r.clock, at) {
			return fmt.Errorf("rotator: no workload certificate before giving up: %w", err)
		}
	}
}

func (r *Rotator) initOnce(ctx context.Context) error {
	var (
		cert *tls.Certificate
		want spiffeid.ID
	)
	// The certificate this agent keeps first, then the provisioning one
	// it was given to start with.
	for _, dir := range []string{r.outDir, r.provDir} {
		if dir == "" || cert != nil {
			continue
		}
		c, id, err := caclient.LoadCertDir(dir, r.clock.Now())
		switch {
		case err == nil:
			cert, want = c, id
		case errors.Is(err, fs.ErrNotExist):
		default:
			r.log.Warn("not authenticating with the certificate in this directory", "dir", dir, logattr.Error, err.Error())
		}
	}
	if cert != nil {
		err := r.request(ctx, cert, "", want, "certificate")
		if err == nil || r.tokenFile == "" || !refused(err) {
			return err
		}
		r.log.Warn("the certificate service refused the certificate on disk; using the token",
			logattr.SPIFFEID, want.String(), logattr.Error, r.explain(err).Error())
	}
	if r.tokenFile == "" {
		return fmt.Errorf("%w: no valid certificate in %s and no token file", errNoAuth, strings.Join(nonEmpty(r.outDir, r.provDir), " or "))
	}
	token, err := caclient.ReadToken(r.tokenFile)
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	return r.request(ctx, nil, token, spiffeid.ID{}, "token")
}

// Run renews the certificate at its grace point until ctx is done, then
// returns nil, and sooner when a taint set (issue 38) says a tainted
// authority signed it: at a random point of the set's spread. Each
// renewal uses a new ECDSA P-256 key and authenticates with the current
// certificate, or with the token once it has expired. A failed renewal
// keeps the current credential and is retried with backoff. Run needs a
// successful Init.
func (r *Rotator) Run(ctx context.Context) error {
	if r.Cell() == nil {
		return errors.New("rotator: Run before a successful Init")
	}
	next := r.rotateAt()
	var taint taintDue
	r.judgeIssued(&taint)
	for failures := 0; ; {
		r.judgeTaints(&taint)
		if !waitUntilOr(ctx, r.clock, taint.wake(next), r.taintWake) {
			return nil
		}
		if tainted := taint.take(r.clock.Now()); !tainted && r.clock.Now().Before(next) {
			continue // a new taint set: judged at the top
		}
		err := r.rotate(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			failures = 0
			next = r.rotateAt()
			r.judgeIssued(&taint)
			r.attempted(nil)
			continue
		}
		failures++
		err = r.explain(err)
		d := r.retry.Delay(failures, mathrand.Float64())
		r.log.Error("renewing the workload certificate failed; keeping the current one", logattr.SPIFFEID, r.ID().String(),
			logattr.Address, r.addr, "not_after", r.NotAfter(), logattr.Error, err.Error(), "retry_in", d)
		next = r.clock.Now().Add(d)
		r.attempted(err)
	}
}

// setTaints makes set the taints in force and wakes Run to judge the
// certificate against it; it returns 1 when a tainted authority signed
// the certificate. A taintFollower.
func (r *Rotator) setTaints(set taintSet) int {
	r.mu.Lock()
	r.taints = set
	tainted := set.signed(r.chain)
	r.mu.Unlock()
	select {
	case r.taintWake <- struct{}{}:
	default:
	}
	if tainted {
		return 1
	}
	return 0
}

// judgeTaints schedules the re-issue of the certificate when a new taint
// set taints it.
func (r *Rotator) judgeTaints(d *taintDue) {
	r.mu.Lock()
	set, chain := r.taints, r.chain
	r.mu.Unlock()
	d.onSet(chain, set, r.clock.Now(), mathrand.Float64())
}

// judgeIssued judges the certificate just issued against the taints in
// force, counting the re-issue a taint asked for.
func (r *Rotator) judgeIssued(d *taintDue) {
	r.mu.Lock()
	set, chain := r.taints, r.chain
	r.mu.Unlock()
	if d.onIssued(chain, set, r.clock.Now(), r.retry, mathrand.Float64()) && r.taintReissues != nil {
		r.taintReissues.Inc()
	}
}

// rotate renews the certificate once.
func (r *Rotator) rotate(ctx context.Context) error {
	r.mu.Lock()
	cur, id := r.cur, r.id
	r.mu.Unlock()
	if r.clock.Now().Before(cur.Leaf.NotAfter) {
		err := r.request(ctx, cur, "", id, "certificate")
		if err == nil || r.tokenFile == "" || !refused(err) {
			return err
		}
		// The server no longer renews this chain (its grant was revoked or
		// it reached --max-renewal-lifetime): a token proves the identity
		// afresh, now rather than after the certificate expired.
		r.log.Warn("the certificate service refused to renew with the current certificate; using the token",
			logattr.SPIFFEID, id.String(), logattr.Error, r.explain(err).Error())
	}
	if r.tokenFile == "" {
		return fmt.Errorf("%w: the certificate expired at %s and there is no token file", errNoAuth, cur.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	token, err := caclient.ReadToken(r.tokenFile)
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	return r.request(ctx, nil, token, id, "token")
}

// request asks for a certificate for a new key, authenticated by
// clientCert or token, for want (zero: whatever the server decides),
// and publishes it.
func (r *Rotator) request(ctx context.Context, clientCert *tls.Certificate, token string, want spiffeid.ID, auth string) (err error) {
	defer func() {
		result := resultSuccess
		if err != nil {
			result = resultFailure
		}
		r.metrics.requests.WithLabelValues(auth, result).Inc()
	}()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	issued, serverID, err := r.obtain(ctx, key, clientCert, token, want)
	if err != nil {
		return err
	}
	cert, err := r.publish(issued, key, serverID)
	if err != nil {
		return err
	}
	r.metrics.notAfter.Set(float64(cert.Leaf.NotAfter.Unix()))
	r.log.Info("workload certificate issued", logattr.SPIFFEID, issued.ID.String(), "authenticated_by", auth,
		"not_after", cert.Leaf.NotAfter.UTC().Format(time.RFC3339))

	// The new credential is served whether or not it reaches the disk;
	// the files there stay a consistent older set on failure.
	if r.outDir != "" {
		if err := caclient.WriteCredentials(r.outDir, key, issued.Chain, issued.Trust); err != nil {
			r.metrics.writeFailures.Inc()
			r.log.Error("writing the workload certificate failed", "dir", r.outDir, logattr.Error, err.Error())
		}
	}
	return nil
}

// obtain makes one call to the certificate service for key, verifying
// the server against the roots held now, and refuses a certificate for
// another identity than the one this agent serves. It returns the server
// ID it verified.
func (r *Rotator) obtain(ctx context.Context, key *ecdsa.PrivateKey, clientCert *tls.Certificate, token string, want spiffeid.ID) (*Issued, spiffeid.ID, error) {
	r.mu.Lock()
	roots, serverID, pinned := r.roots, r.serverID, r.id
	r.mu.Unlock()
	if serverID.IsZero() {
		var err error
		if serverID, err = caclient.ExpectedServerID(roots, want); err != nil {
			return nil, spiffeid.ID{}, err
		}
	}
	callCtx, cancel := context.WithTimeout(ctx, rotatorCallTimeout)
	defer cancel()
	issued, err := Obtain(callCtx, r.addr, roots, serverID, clientCert,
		caclient.Request{Key: key, ID: want, TTL: r.ttl, Token: token}, x509svid.WithTime(r.clock.Now()))
	if err != nil {
		return nil, spiffeid.ID{}, err
	}
	if !pinned.IsZero() && issued.ID != pinned {
		return nil, spiffeid.ID{}, fmt.Errorf("unusable certificate: issued %s, but this agent serves %s", issued.ID, pinned)
	}
	return issued, serverID, nil
}

// publish makes issued, with key, the current credential: served from the
// cell, used to authenticate the next renewal, and its trust the roots
// the server is verified with from now on.
func (r *Rotator) publish(issued *Issued, key *ecdsa.PrivateKey, serverID spiffeid.ID) (*tls.Certificate, error) {
	id, leafChain := issued.ID, issued.Chain
	der := make([][]byte, len(leafChain))
	for i, c := range leafChain {
		der[i] = c.Raw
	}
	cert := &tls.Certificate{Certificate: der, PrivateKey: key, Leaf: leafChain[0]}

	r.mu.Lock()
	defer r.mu.Unlock()
	cell := r.cell
	if cell == nil {
		cell = sds.NewCredentialCell(id)
	}
	if err := cell.Set(leafChain, key); err != nil {
		return nil, err
	}
	r.cell, r.cur, r.id, r.serverID, r.chain = cell, cert, id, serverID, slices.Clone(leafChain)
	// ROOTCA came over a connection verified against the roots held so
	// far: the CA's roots as they are now, so a rotation does not strand
	// the agent on its --root-cert file.
	r.roots = slices.Clone(issued.Trust.Local)
	r.trust = issued.Trust
	return cert, nil
}

// attempted reports an attempt to the test hook.
func (r *Rotator) attempted(err error) {
	if r.afterAttempt != nil {
		r.afterAttempt(err)
	}
}

// rotateAt is the grace point of the current certificate.
func (r *Rotator) rotateAt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return gracePoint(r.cur.Leaf.NotBefore, r.cur.Leaf.NotAfter, r.grace)
}

// gracePoint is notBefore + ratio of the lifetime.
func gracePoint(notBefore, notAfter time.Time, ratio float64) time.Time {
	return notBefore.Add(time.Duration(float64(notAfter.Sub(notBefore)) * ratio))
}

// sleepUntil waits until c reaches at, or ctx is done (false). It checks
// the time again after arming the timer, so a fake clock stepped between
// the two is not missed.
func sleepUntil(ctx context.Context, c clock.Clock, at time.Time) bool {
	for {
		if ctx.Err() != nil {
			return false
		}
		d := at.Sub(c.Now())
		if d <= 0 {
			return true
		}
		t := c.NewTimer(d)
		if !c.Now().Before(at) {
			t.Stop()
			return true
		}
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C():
		}
	}
}

// waitUntilOr is sleepUntil that also returns (true) when wake fires; a
// nil wake never does.
func waitUntilOr(ctx context.Context, c clock.Clock, at time.Time, wake <-chan struct{}) bool {
	d := at.Sub(c.Now())
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := c.NewTimer(d)
	defer t.Stop()
	if !c.Now().Before(at) {
		return ctx.Err() == nil
	}
	select {
	case <-ctx.Done():
		return false
	case <-wake:
	case <-t.C():
	}
	return true
}

// transient reports whether err is worth retrying unchanged.
func transient(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.ResourceExhausted, codes.DeadlineExceeded:
		return true
	}
	return false
}

// refused reports whether the server refused the credentials or the
// identity.
func refused(err error) bool {
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied:
		return true
	}
	return false
}

// explain says what a failed call to the certificate service means.
func (r *Rotator) explain(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	switch st.Code() {
	case codes.Unauthenticated:
		return fmt.Errorf("the CA at %s did not accept the credentials (token or certificate): %s", r.addr, msg)
	case codes.PermissionDenied:
		return fmt.Errorf("the CA at %s refused to issue this identity: %s", r.addr, msg)
	case codes.InvalidArgument:
		return fmt.Errorf("the CA at %s refused the request: %s", r.addr, msg)
	case codes.ResourceExhausted:
		return fmt.Errorf("the CA at %s is busy or rate-limits this identity: %s", r.addr, msg)
	case codes.Unavailable:
		return fmt.Errorf("cannot reach the CA at %s (does --root-cert hold its roots?): %s", r.addr, msg)
	case codes.DeadlineExceeded:
		return fmt.Errorf("no answer from the CA at %s within %s: %s", r.addr, rotatorCallTimeout, msg)
	}
	return fmt.Errorf("the CA at %s: %s: %s", r.addr, st.Code(), msg)
}

// Cell is the credential cell for the issued identity; nil before a
// successful Init.
func (r *Rotator) Cell() *sds.CredentialCell {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cell
}

// ID is the workload identity; zero before a successful Init.
func (r *Rotator) ID() spiffeid.ID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.id
}

// NotAfter is the expiry of the current certificate; zero before Init.
func (r *Rotator) NotAfter() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		return time.Time{}
	}
	return r.cur.Leaf.NotAfter
}

// ClientTLS is the TLS client configuration for other connections to the
// certificate service's server (the upstream SDS stream): it presents the
// current certificate and verifies the server as its SPIFFE ID against the
// current server roots, on every handshake, so rotations of either apply
// to new connections.
func (r *Rotator) ClientTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Verified in VerifyConnection as an X509-SVID; host names play
		// no part.
		InsecureSkipVerify: true, //nolint:gosec // see above
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.cur == nil {
				return &tls.Certificate{}, nil // no certificate: the server decides
			}
			return r.cur, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			r.mu.Lock()
			roots, serverID := r.roots, r.serverID
			r.mu.Unlock()
			if serverID.IsZero() {
				return errors.New("the certificate service's SPIFFE ID is not known yet")
			}
			return caclient.VerifyServer(roots, serverID)(cs)
		},
	}
}

// Trust is the trust the server handed out with the last certificate,
// per trust domain (FetchTrust); empty before Init.
func (r *Rotator) Trust() caclient.Trust {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.trust
}

// SetServerRoots replaces the roots trusted for the server, so a root
// rotation of the CA does not strand the agent on its --root-cert file.
// An empty list is ignored.
func (r *Rotator) SetServerRoots(roots []*x509.Certificate) {
	roots = slices.DeleteFunc(slices.Clone(roots), func(c *x509.Certificate) bool { return c == nil })
	if len(roots) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.roots = roots
}

type rotatorMetrics struct {
	requests      *prometheus.CounterVec
	notAfter      prometheus.Gauge
	writeFailures prometheus.Counter
}

func newRotatorMetrics(reg prometheus.Registerer) (*rotatorMetrics, error) {
	m := &rotatorMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_agent_certificate_requests_total",
			Help: "Requests for the workload certificate to the certificate service, by authentication (token, certificate) and result; on failure the current certificate stays.",
		}, []string{"auth", "result"}),
		notAfter: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustbridge_agent_certificate_expiry_timestamp_seconds",
			Help: "NotAfter of the workload certificate served, in seconds since the epoch.",
		}),
		writeFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_agent_certificate_write_failures_total",
			Help: "Failures to write an issued workload certificate to the output directory; it is served nonetheless.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.notAfter, m.writeFailures} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	return m, nil
}

// nonEmpty is its arguments without the empty ones.
func nonEmpty(s ...string) []string {
	return slices.DeleteFunc(s, func(v string) bool { return v == "" })
}
