package authn

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/fileutil"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// Bootstrap token file limits.
const (
	// MinBootstrapTokenLen is the shortest bootstrap token accepted. Sixteen
	// characters of the base64 alphabet carry 96 bits when random, out of
	// reach of online guessing at any request rate the service allows;
	// shorter values are typically hand-typed passwords.
	MinBootstrapTokenLen = 16
	// MaxBootstrapTokenLen is the longest bootstrap token accepted.
	MaxBootstrapTokenLen = 1024
	// MaxBootstrapFileSize caps the token file: it is read whole on every
	// reload.
	MaxBootstrapFileSize = 1 << 20
	// DefaultBootstrapReloadInterval is how often Run re-reads the file when
	// BootstrapTokensConfig.ReloadInterval is 0.
	DefaultBootstrapReloadInterval = 10 * time.Second
)

// BootstrapTokensConfig configures NewBootstrapTokens.
type BootstrapTokensConfig struct {
	// Path of the token file. Required.
	Path string
	// TrustDomain every listed SPIFFE ID must belong to. Required.
	TrustDomain spiffeid.TrustDomain
	// ReloadInterval is how often Run re-reads the file; default
	// DefaultBootstrapReloadInterval.
	ReloadInterval time.Duration
	// Clock drives Run; nil means the real clock.
	Clock clock.Clock
	// Logger; nil discards.
	Logger *slog.Logger
	// Registerer receives the metrics; nil means a private registry.
	Registerer prometheus.Registerer
	// OnReload, when set, is called after every reload attempt (Run or
	// Reload) with whether the token set changed and the error, if any.
	OnReload func(changed bool, err error)
	// Ledger remembers which single-use tokens were consumed. nil keeps
	// them in memory, for this value's life only: a server passes a
	// persistent one (FileLedger, KubeLedger), or a restart would make
	// every consumed token usable again.
	Ledger TokenLedger
}

// BootstrapTokens authenticates callers by a shared secret bearer token
// listed in a file, for laptops and VMs without Kubernetes. It is a
// bootstrap-only path: a token is a secret that proves nothing about the
// machine holding it, so use it to obtain a first X509-SVID and
// authenticate with that SVID afterwards.
//
// The file has one "token,spiffe-id[,expires=<RFC 3339 time>][,reusable]"
// per line; blank lines and lines starting with # are ignored. A token is
// single-use unless its line says reusable: the Identity it proves carries
// a Spend function, which the certificate service calls once it has signed
// the certificate the token buys, and which records the token as consumed
// in the Ledger; of concurrent requests with one token exactly one gets
// its certificate. A consumed token, or one past its expiry, no longer
// authenticates (ErrTokenConsumed, ErrTokenExpired); certificates it bought
// renew with themselves, as before.
//
// Only SHA-256 digests of the tokens are kept in memory, the ledger keys
// consumptions by grant reference (BootstrapGrantRef), and a presented
// token is compared with every entry in constant time. A file that fails
// to load on Reload leaves the previous token set in force; Err reports
// the failure.
type BootstrapTokens struct {
	cfg BootstrapTokensConfig
	m   *bootstrapMetrics

	set atomic.Pointer[tokenSet]

	mu       sync.Mutex // serializes reloads and guards the fields below
	lastErr  error
	warnings []string
}

// tokenSet is one loaded file; immutable once built.
type tokenSet struct {
	digest  [32]byte // of the file, to skip unchanged reloads
	entries []tokenEntry
}

type tokenEntry struct {
	hash tokenKey
	id   spiffeid.ID
	ref  string // BootstrapGrantRef(hash), filled by load
	line int
	// expires, when not zero, is the first instant the token no longer
	// authenticates.
	expires time.Time
	// reusable tokens are never consumed (the behaviour before single-use
	// tokens, for labs).
	reusable bool
}

var _ Authenticator = (*BootstrapTokens)(nil)

// LoadBootstrapTokens reads the token file at path, for the bootstrap-only
// path of machines without Kubernetes (see BootstrapTokens). Identities must
// belong to td and have a path. Warnings reports a file others may read.
// Consumed single-use tokens are remembered in memory only (MemoryLedger).
// Use NewBootstrapTokens for a persistent ledger, a logger, metrics and
// reloading with Run.
func LoadBootstrapTokens(path string, td spiffeid.TrustDomain) (*BootstrapTokens, error) {
	return NewBootstrapTokens(BootstrapTokensConfig{Path: path, TrustDomain: td})
}

// NewBootstrapTokens validates cfg and reads the file once; Run keeps it
// current.
func NewBootstrapTokens(cfg BootstrapTokensConfig) (*BootstrapTokens, error) {
	switch {
	case cfg.Path == "":
		return nil, errors.New("authn: bootstrap tokens: a file path is required")
	case cfg.TrustDomain.IsZero():
		return nil, errors.New("authn: bootstrap tokens: a trust domain is required")
	case cfg.ReloadInterval < 0:
		return nil, fmt.Errorf("authn: bootstrap tokens: reload interval %s is negative", cfg.ReloadInterval)
	}
	if cfg.ReloadInterval == 0 {
		cfg.ReloadInterval = DefaultBootstrapReloadInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	if cfg.Ledger == nil {
		cfg.Ledger = NewMemoryLedger()
	}
	b := &BootstrapTokens{cfg: cfg}
	set, warnings, err := b.load()
	if err != nil {
		return nil, err
	}
	b.set.Store(set)
	b.warnings = warnings
	b.logWarnings(warnings)
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"trust_domain": cfg.TrustDomain.Name()}, cfg.Registerer)
	m, err := newBootstrapMetrics(reg, b.Len)
	if err != nil {
		return nil, fmt.Errorf("authn: bootstrap token metrics: %w", err)
	}
	b.m = m
	return b, nil
}

// Authenticate looks r.BearerToken up among the tokens. Every entry is
// compared, whether or not an earlier one matched, so the time taken does
// not reveal which entry matched or how close a guess came. A matching
// token past its expiry, or single-use and already consumed, is refused;
// a single-use one that is not yet consumed proves an Identity whose Spend
// consumes it.
func (b *BootstrapTokens) Authenticate(ctx context.Context, r Request) (Identity, error) {
	token := r.BearerToken
	if token == "" {
		if r.AuthorizationError != nil {
			return Identity{}, invalid(MethodBootstrapToken, r.AuthorizationError)
		}
		return Identity{}, noCredentials(MethodBootstrapToken, "no bearer token")
	}
	if len(token) > MaxTokenSize {
		return Identity{}, invalidf(MethodBootstrapToken, "bearer token is %d bytes, more than %d", len(token), MaxTokenSize)
	}
	h := sha256.Sum256([]byte(token))
	set := b.set.Load()
	found, match := 0, 0
	for i := range set.entries {
		eq := subtle.ConstantTimeCompare(h[:], set.entries[i].hash[:])
		match = subtle.ConstantTimeSelect(eq, i, match)
		found |= eq
	}
	if found != 1 {
		b.m.refusals.WithLabelValues(refusedUnknown).Inc()
		return Identity{}, invalidf(MethodBootstrapToken, "bearer token matches no bootstrap token")
	}
	e := set.entries[match]
	if err := b.usable(ctx, e); err != nil {
		return Identity{}, err
	}
	ident := Identity{ID: e.id, Method: MethodBootstrapToken, Grant: &Grant{Method: MethodBootstrapToken, Ref: e.ref}, NotAfter: e.expires}
	if !e.reusable {
		ident.Spend = func(ctx context.Context) error { return b.consume(ctx, e) }
	}
	return ident, nil
}

// usable refuses a matched token that expired, or that is single-use and
// consumed. A ledger that cannot answer is ErrUnavailable: the caller
// retries rather than being told its token is bad.
func (b *BootstrapTokens) usable(ctx context.Context, e tokenEntry) error {
	if now := b.cfg.Clock.Now(); !e.expires.IsZero() && !now.Before(e.expires) {
		b.m.refusals.WithLabelValues(refusedExpired).Inc()
		return invalid(MethodBootstrapToken, fmt.Errorf("the bootstrap token on line %d of %s (reference %s) for %s expired at %s: %w",
			e.line, b.cfg.Path, e.ref, e.id, e.expires.UTC().Format(time.RFC3339), ErrTokenExpired))
	}
	if e.reusable {
		return nil
	}
	c, consumed, err := b.cfg.Ledger.Consumed(ctx, e.ref)
	if err != nil {
		return fmt.Errorf("authn: %s: consumed-token ledger: %w: %w", MethodBootstrapToken, ErrUnavailable, err)
	}
	if consumed {
		b.m.refusals.WithLabelValues(refusedConsumed).Inc()
		return invalid(MethodBootstrapToken, consumedError(b.cfg.Path, e, c))
	}
	return nil
}

// consume records e as consumed: Identity.Spend of a single-use token. It
// wraps ErrTokenConsumed and ErrInvalidCredentials when another request
// consumed the token first, and ErrUnavailable when the ledger failed.
func (b *BootstrapTokens) consume(ctx context.Context, e tokenEntry) error {
	c := Consumption{Ref: e.ref, ID: e.id, At: b.cfg.Clock.Now().UTC().Truncate(time.Second)}
	err := b.cfg.Ledger.Consume(ctx, c)
	switch {
	case err == nil:
		b.m.consumptions.WithLabelValues(consumeOK).Inc()
		b.cfg.Logger.Info("single-use bootstrap token consumed", logattr.GrantRef, e.ref, logattr.SPIFFEID, e.id.String(), "line", e.line, "path", b.cfg.Path)
		return nil
	case errors.Is(err, ErrTokenConsumed):
		b.m.consumptions.WithLabelValues(consumeLost).Inc()
		b.m.refusals.WithLabelValues(refusedConsumed).Inc()
		prev, _, _ := b.cfg.Ledger.Consumed(ctx, e.ref)
		return invalid(MethodBootstrapToken, consumedError(b.cfg.Path, e, prev))
	default:
		b.m.consumptions.WithLabelValues(consumeFailed).Inc()
		return fmt.Errorf("authn: %s: recording the token (reference %s) as consumed: %w: %w", MethodBootstrapToken, e.ref, ErrUnavailable, err)
	}
}

// consumedError says which token was consumed, when and for whom, as far
// as the ledger knows; it never holds the token.
func consumedError(path string, e tokenEntry, c Consumption) error {
	when := ""
	if !c.At.IsZero() {
		when = " at " + c.At.UTC().Format(time.RFC3339)
	}
	return fmt.Errorf("the single-use bootstrap token on line %d of %s (reference %s) for %s was consumed%s: %w",
		e.line, path, e.ref, e.id, when, ErrTokenConsumed)
}

// CheckGrant reports whether a bootstrap grant still stands: a token with
// reference g.Ref is listed in the file as it is now, for id. A token that
// was removed, or now names another identity, no longer grants id, so the
// certificates descended from it stop renewing. The answer follows the
// last successful load; while a reload fails the previous tokens decide.
func (b *BootstrapTokens) CheckGrant(_ context.Context, id spiffeid.ID, g Grant) error {
	if g.Method != MethodBootstrapToken {
		return fmt.Errorf("authn: %s: grant of method %q is not a bootstrap grant: %w", MethodBootstrapToken, g.Method, ErrGrantRevoked)
	}
	set := b.set.Load()
	for i := range set.entries {
		if set.entries[i].ref == g.Ref && set.entries[i].id == id {
			return nil
		}
	}
	return fmt.Errorf("authn: %s: the bootstrap token (reference %s) that granted %s is no longer listed in %s: %w",
		MethodBootstrapToken, g.Ref, id, b.cfg.Path, ErrGrantRevoked)
}

// ErrSingleUse means a service that cannot spend a credential on one
// certificate (an SDS stream, which mints and re-authenticates for as long
// as it lasts) was offered a single-use one. It is always wrapped.
var ErrSingleUse = errors.New("single-use credential")

// ReusableOnly wraps an authenticator for a service that cannot spend a
// single-use credential on one certificate: an identity whose Spend is set
// is refused (ErrInvalidCredentials, ErrSingleUse). Such a token buys one
// certificate from the certificate service; the caller then authenticates
// with that certificate.
func ReusableOnly(next Authenticator) Authenticator {
	return AuthenticatorFunc(func(ctx context.Context, r Request) (Identity, error) {
		ident, err := next.Authenticate(ctx, r)
		if err != nil || ident.Spend == nil {
			return ident, err
		}
		return Identity{}, invalid(ident.Method, fmt.Errorf("the token for %s is single-use: it buys one certificate from the certificate service "+
			"(trustbridge ca request, trustbridge agent), which then authenticates here; mark its line reusable to use it directly: %w", ident.ID, ErrSingleUse))
	})
}

// Len returns the number of tokens in force.
func (b *BootstrapTokens) Len() int { return len(b.set.Load().entries) }

// Warnings returns the warnings of the last successful load, such as a file
// that group or others may read.
func (b *BootstrapTokens) Warnings() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.warnings...)
}

// Err returns the error of the last reload, nil after a successful one.
// While it is set, the tokens loaded before it stay in force.
func (b *BootstrapTokens) Err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastErr
}

// Reload re-reads the file. On error the current tokens stay in force and
// Err reports the error until a later reload succeeds.
func (b *BootstrapTokens) Reload() error {
	_, err := b.reload()
	return err
}

// TokenReload is what a reload of the token file changed: the tokens in
// force after it, and how many tokens it added and removed.
type TokenReload struct {
	Tokens, Added, Removed int
}

// ReloadCounted is Reload, saying what it changed (for the audit log of
// a reload an operator asked for).
func (b *BootstrapTokens) ReloadCounted() (TokenReload, error) {
	return b.reload()
}

// countChanges says how many tokens of next old lacks, and the reverse.
func countChanges(old, next *tokenSet) TokenReload {
	had := make(map[tokenKey]bool, len(old.entries))
	for _, e := range old.entries {
		had[e.hash] = true
	}
	r := TokenReload{Tokens: len(next.entries)}
	for _, e := range next.entries {
		if had[e.hash] {
			delete(had, e.hash)
		} else {
			r.Added++
		}
	}
	r.Removed = len(had)
	return r
}

func (b *BootstrapTokens) reload() (TokenReload, error) {
	b.mu.Lock()
	set, warnings, err := b.load()
	changed := false
	counts := TokenReload{Tokens: len(b.set.Load().entries)}
	if err != nil {
		b.lastErr = err
		b.m.reloads.WithLabelValues("error").Inc()
		b.cfg.Logger.Error("bootstrap token file not reloaded; keeping the previous tokens",
			logattr.Error, err, "path", b.cfg.Path)
	} else {
		b.lastErr = nil
		b.m.reloads.WithLabelValues("success").Inc()
		b.warnings = warnings // the mode may change without the content
		if set.digest != b.set.Load().digest {
			changed = true
			counts = countChanges(b.set.Load(), set)
			b.set.Store(set)
			b.cfg.Logger.Info("bootstrap token file reloaded", "path", b.cfg.Path, "tokens", len(set.entries))
			b.logWarnings(warnings)
		}
	}
	b.mu.Unlock()
	if b.cfg.OnReload != nil {
		b.cfg.OnReload(changed, err)
	}
	return counts, err
}

// Run reloads the file every ReloadInterval until ctx is done; it returns
// nil then. Reload failures are logged and keep the previous tokens.
func (b *BootstrapTokens) Run(ctx context.Context) error {
	t := b.cfg.Clock.NewTimer(b.cfg.ReloadInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			_, _ = b.reload()
			t.Reset(b.cfg.ReloadInterval)
		}
	}
}

func (b *BootstrapTokens) logWarnings(warnings []string) {
	for _, w := range warnings {
		b.cfg.Logger.Warn("bootstrap token file", logattr.Warning, w, "path", b.cfg.Path)
	}
}

// load reads and parses the file.
func (b *BootstrapTokens) load() (*tokenSet, []string, error) {
	data, mode, err := readTokenFile(b.cfg.Path)
	if err != nil {
		return nil, nil, fmt.Errorf("authn: bootstrap tokens: %w", err)
	}
	set, err := parseBootstrapTokens(data, b.cfg.TrustDomain)
	if err != nil {
		return nil, nil, fmt.Errorf("authn: bootstrap tokens %s: %w", b.cfg.Path, err)
	}
	fillGrantRefs(set, b.set.Load())
	var warnings []string
	if mode.Perm()&0o077 != 0 {
		warnings = append(warnings, fmt.Sprintf("%s has mode %#o: group or others may read or change the tokens; use 0600", b.cfg.Path, mode.Perm()))
	}
	return set, warnings, nil
}

// fillGrantRefs computes each token's grant reference, reusing those of
// prev (nil on the first load): a reference costs milliseconds, and the
// file is parsed on every reload.
func fillGrantRefs(set, prev *tokenSet) {
	known := map[tokenKey]string{}
	if prev != nil {
		for _, e := range prev.entries {
			known[e.hash] = e.ref
		}
	}
	for i := range set.entries {
		e := &set.entries[i]
		if ref, ok := known[e.hash]; ok {
			e.ref = ref
		} else {
			e.ref = BootstrapGrantRef(e.hash)
		}
	}
}

// readTokenFile reads a regular file of at most MaxBootstrapFileSize bytes.
func readTokenFile(path string) ([]byte, fs.FileMode, error) {
	return fileutil.ReadFile(path, MaxBootstrapFileSize)
}

// TokenLineFormat is the shape of a token file line, for messages and help.
const TokenLineFormat = "token,spiffe-id[,expires=<RFC 3339 time>][,reusable]"

// Options of a token file line, after the token and the SPIFFE ID.
const (
	optionReusable = "reusable"
	optionExpires  = "expires="
)

// parseBootstrapTokens parses a token file. Errors name the line and never
// include a token; a SPIFFE ID is quoted only once it parsed as one, so a
// line with its fields swapped does not echo the token either, and an
// option that does not parse is named by its position, not its text.
func parseBootstrapTokens(data []byte, td spiffeid.TrustDomain) (*tokenSet, error) {
	set := &tokenSet{digest: sha256.Sum256(data)}
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	seen := make(map[tokenKey]int)
	for i, line := range strings.Split(string(data), "\n") {
		n := i + 1
		line = strings.Trim(line, " \t\r")
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		e, err := parseTokenLine(line, td)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if first, dup := seen[e.hash]; dup {
			return nil, fmt.Errorf("line %d: token repeats the one on line %d", n, first)
		}
		seen[e.hash] = n
		e.line = n
		set.entries = append(set.entries, e)
	}
	return set, nil
}

// parseTokenLine parses one line that is neither blank nor a comment.
func parseTokenLine(line string, td spiffeid.TrustDomain) (tokenEntry, error) {
	fields := strings.Split(line, ",")
	if len(fields) < 2 {
		return tokenEntry{}, fmt.Errorf("want token,spiffe-id, got %d fields (a line is %s)", len(fields), TokenLineFormat)
	}
	token := strings.Trim(fields[0], " \t")
	rawID := strings.Trim(fields[1], " \t")
	if err := checkBootstrapToken(token); err != nil {
		return tokenEntry{}, err
	}
	id, err := spiffeid.FromString(rawID)
	if err != nil {
		return tokenEntry{}, fmt.Errorf("second field is not a SPIFFE ID: %w", err)
	}
	if !id.MemberOf(td) {
		return tokenEntry{}, fmt.Errorf("%s is not in trust domain %s", id, td)
	}
	if id.Path() == "" {
		return tokenEntry{}, fmt.Errorf("%s has no path; a workload ID needs one", id)
	}
	e := tokenEntry{hash: tokenKey(sha256.Sum256([]byte(token))), id: id}
	if err := e.parseOptions(fields[2:]); err != nil {
		return tokenEntry{}, err
	}
	return e, nil
}

// parseOptions reads the fields after the SPIFFE ID: each of expires= and
// reusable at most once, in any order. Old files have none.
func (e *tokenEntry) parseOptions(fields []string) error {
	hasExpiry := false
	for i, f := range fields {
		n := i + 3
		f = strings.Trim(f, " \t")
		switch {
		case f == optionReusable:
			if e.reusable {
				return fmt.Errorf("field %d repeats %s", n, optionReusable)
			}
			e.reusable = true
		case strings.HasPrefix(f, optionExpires):
			if hasExpiry {
				return fmt.Errorf("field %d repeats %s", n, strings.TrimSuffix(optionExpires, "="))
			}
			t, err := time.Parse(time.RFC3339, strings.TrimPrefix(f, optionExpires))
			if err != nil {
				return fmt.Errorf("field %d: expires= wants an RFC 3339 time, such as 2026-12-01T10:00:00Z", n)
			}
			e.expires, hasExpiry = t.UTC(), true
		case f == "":
			return fmt.Errorf("field %d is empty (a line is %s)", n, TokenLineFormat)
		default:
			return fmt.Errorf("field %d is neither %s nor expires=<RFC 3339 time> (a line is %s)", n, optionReusable, TokenLineFormat)
		}
	}
	return nil
}

// checkBootstrapToken applies the token rules without echoing the token.
func checkBootstrapToken(token string) error {
	switch {
	case len(token) < MinBootstrapTokenLen:
		return fmt.Errorf("token is %d bytes, want at least %d", len(token), MinBootstrapTokenLen)
	case len(token) > MaxBootstrapTokenLen:
		return fmt.Errorf("token is %d bytes, want at most %d", len(token), MaxBootstrapTokenLen)
	case !isToken68(token):
		// Callers send it as "authorization: Bearer <token>".
		return errors.New("token has characters outside the RFC 6750 b64token set (letters, digits, - . _ ~ + / and trailing =)")
	}
	if _, err := peekJWT(token); err == nil {
		// The TokenReview authenticator would send it to the API server.
		return errors.New("token has the shape of a JWT; bootstrap tokens must be opaque random strings")
	}
	return nil
}

// Labels of the bootstrap token metrics.
const (
	refusedUnknown  = "unknown"  // matches no token
	refusedConsumed = "consumed" // single-use, already consumed
	refusedExpired  = "expired"  // past its expires=

	consumeOK     = "consumed"         // this request consumed it
	consumeLost   = "already_consumed" // another request got there first
	consumeFailed = "error"            // the ledger could not record it
)

type bootstrapMetrics struct {
	reloads      *prometheus.CounterVec
	refusals     *prometheus.CounterVec
	consumptions *prometheus.CounterVec
}

func newBootstrapMetrics(reg prometheus.Registerer, n func() int) (*bootstrapMetrics, error) {
	m := &bootstrapMetrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_authn_bootstrap_token_reloads_total",
			Help: "Reloads of the bootstrap token file, by result (success, error); on error the previous tokens stay in force.",
		}, []string{"result"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_authn_bootstrap_token_refusals_total",
			Help: "Bearer tokens the bootstrap token authenticator refused, by reason (unknown: matches no token in the file, also every token of another kind when nothing earlier accepted it; consumed: a single-use token already used, including the losers of concurrent requests; expired: past its expires=).",
		}, []string{"reason"}),
		consumptions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_authn_bootstrap_token_consumptions_total",
			Help: "Single-use bootstrap tokens spent on an issued certificate, by result (consumed; already_consumed: a concurrent request consumed it first, its certificate is withheld; error: the ledger could not record it, its certificate is withheld and the token stays usable).",
		}, []string{"result"}),
	}
	tokens := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "trustbridge_authn_bootstrap_tokens",
		Help: "Bootstrap tokens in force.",
	}, func() float64 { return float64(n()) })
	for _, c := range []prometheus.Collector{m.reloads, m.refusals, m.consumptions, tokens} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, l := range []string{"success", "error"} {
		m.reloads.WithLabelValues(l)
	}
	for _, l := range []string{refusedUnknown, refusedConsumed, refusedExpired} {
		m.refusals.WithLabelValues(l)
	}
	for _, l := range []string{consumeOK, consumeLost, consumeFailed} {
		m.consumptions.WithLabelValues(l)
	}
	return m, nil
}
