package oidc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// DefaultRefreshInterval is the least time between two key fetches of one
// issuer that an unknown kid triggers.
const DefaultRefreshInterval = 30 * time.Second

// Config configures an Authenticator.
type Config struct {
	// TrustDomain is the trust domain of every identity; required.
	TrustDomain spiffeid.TrustDomain
	// Issuers are the trusted issuers, as ParseConfig returns them plus
	// Roots read from CAFile.
	Issuers []IssuerConfig
	// RefreshInterval is the least time between two key fetches per
	// issuer for an unknown kid; zero means DefaultRefreshInterval.
	RefreshInterval time.Duration
	// Clock; nil means the real clock.
	Clock clock.Clock
	// Logger; nil discards.
	Logger *slog.Logger
	// Registerer for the metrics; nil registers nowhere.
	Registerer prometheus.Registerer

	// newKeys builds an issuer's key source; nil means the remote key set
	// (discovery and JWKS). Tests set it to serve generated keys.
	newKeys func(IssuerConfig) (keySource, error)
}

// keySource is an issuer's verification keys (keySet).
type keySource interface {
	// Keys returns the keys with key id kid (all when kid is ""), or an
	// error wrapping ErrUnknownKey or ErrKeysUnavailable.
	Keys(ctx context.Context, kid string) ([]jose.JSONWebKey, error)
	Status() keySetStatus
}

// Authenticator authenticates callers by JWTs of configured issuers,
// verified offline against each issuer's published keys. It implements
// authn.Authenticator and authn.GrantChecker.
type Authenticator struct {
	td     spiffeid.TrustDomain
	clk    clock.PassiveClock
	logger *slog.Logger
	tokens *prometheus.CounterVec

	issuers []*issuer          // in configuration order
	byIss   map[string]*issuer // by "iss"
	byName  map[string]*issuer
}

// issuer is one configured issuer, ready to verify.
type issuer struct {
	cfg    IssuerConfig
	method string
	tmpl   *template // nil for KindKubernetes
	keys   keySource
	// grantUID is authn.IssuerGrantUID of the issuer URL, recorded in
	// the grants it makes and compared by CheckGrant.
	grantUID string
}

// IssuerStatus is what Status reports about one issuer.
type IssuerStatus struct {
	Name, Issuer           string
	Kind                   Kind
	Keys                   int
	LastFetch, LastSuccess time.Time
	LastError              string
}

// New checks cfg and builds the Authenticator. It starts nothing and
// fetches nothing: keys are fetched by Run's warm-up or on first use.
func New(cfg Config) (*Authenticator, error) {
	a, err := newAuthenticator(cfg)
	if err != nil {
		return nil, fmt.Errorf("authn: oidc: %w", err)
	}
	return a, nil
}

func newAuthenticator(cfg Config) (*Authenticator, error) {
	if cfg.TrustDomain.IsZero() {
		return nil, errors.New("trust domain is required")
	}
	if cfg.RefreshInterval < 0 {
		return nil, fmt.Errorf("refresh interval %s is negative", cfg.RefreshInterval)
	}
	cfg = withDefaults(cfg)
	a := &Authenticator{
		td: cfg.TrustDomain, clk: cfg.Clock, logger: cfg.Logger,
		byIss: map[string]*issuer{}, byName: map[string]*issuer{},
	}
	newKeys, err := keySourceBuilder(cfg)
	if err != nil {
		return nil, err
	}
	for i, ic := range cfg.Issuers {
		is, err := a.addIssuer(ic, newKeys)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", issuerRef(i, ic), err)
		}
		a.issuers = append(a.issuers, is)
	}
	if a.tokens, err = newTokenMetrics(cfg.Registerer, a.issuers); err != nil {
		return nil, err
	}
	return a, nil
}

// issuerRef names the i-th issuer in an error: by its name and YAML line
// when it came from a file, by its index and name otherwise.
func issuerRef(i int, ic IssuerConfig) string {
	if ic.Line > 0 {
		return fmt.Sprintf("issuer %q (line %d)", truncate(ic.Name, 64), ic.Line)
	}
	return fmt.Sprintf("issuer %d (%q)", i, truncate(ic.Name, 64))
}

func withDefaults(cfg Config) Config {
	if cfg.RefreshInterval == 0 {
		cfg.RefreshInterval = DefaultRefreshInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	return cfg
}

// keySourceBuilder returns cfg.newKeys, or one building remote key sets
// that share one set of key metrics.
func keySourceBuilder(cfg Config) (func(IssuerConfig) (keySource, error), error) {
	if cfg.newKeys != nil {
		return cfg.newKeys, nil
	}
	km, err := newKeyMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return func(ic IssuerConfig) (keySource, error) {
		ks, err := newKeySet(keySetConfig{
			name: ic.Name, issuer: ic.Issuer, roots: ic.Roots, allowPrivate: ic.AllowPrivateAddresses,
			refreshInterval: cfg.RefreshInterval, clock: cfg.Clock, // maxKeyAge: the key set's 24h default
			logger: cfg.Logger, metrics: km,
		})
		if err != nil {
			return nil, err
		}
		return ks, nil
	}, nil
}

func (a *Authenticator) addIssuer(ic IssuerConfig, newKeys func(IssuerConfig) (keySource, error)) (*issuer, error) {
	ic.Audiences = append([]string(nil), ic.Audiences...)
	ic.Algorithms = append([]string(nil), ic.Algorithms...)
	ic.Claims = cloneRules(ic.Claims)
	if err := ic.check(); err != nil {
		return nil, err
	}
	if _, dup := a.byName[ic.Name]; dup {
		return nil, fmt.Errorf("name %q is used by two issuers", ic.Name)
	}
	if _, dup := a.byIss[ic.Issuer]; dup {
		return nil, fmt.Errorf("issuer %q is configured twice", ic.Issuer)
	}
	is := &issuer{cfg: ic, method: authn.MethodOIDC, grantUID: authn.IssuerGrantUID(ic.Issuer)}
	if ic.Kind == KindKubernetes {
		is.method = authn.MethodKubernetesIssuer
	} else {
		t, err := parseTemplate(ic.SPIFFEID)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", keySPIFFEID, err)
		}
		if err := t.checkTrustDomain(a.td); err != nil {
			return nil, fmt.Errorf("%s: %w", keySPIFFEID, err)
		}
		is.tmpl = t
	}
	ks, err := newKeys(ic)
	if err != nil {
		return nil, fmt.Errorf("keys: %w", err)
	}
	is.keys = ks
	a.byName[ic.Name], a.byIss[ic.Issuer] = is, is
	return is, nil
}

func cloneRules(rules []ClaimRule) []ClaimRule {
	out := make([]ClaimRule, len(rules))
	for i, r := range rules {
		out[i] = ClaimRule{Claim: r.Claim, Values: append([]string(nil), r.Values...)}
	}
	return out
}

func newTokenMetrics(reg prometheus.Registerer, issuers []*issuer) (*prometheus.CounterVec, error) {
	tokens := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustbridge_authn_oidc_tokens_total",
		Help: "Bearer tokens of configured OIDC and Kubernetes issuers, by issuer name and result (accepted, or the reason for refusal).",
	}, []string{"issuer", "result"})
	if err := reg.Register(tokens); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	for _, is := range issuers {
		for _, r := range allResults() {
			tokens.WithLabelValues(is.cfg.Name, r)
		}
	}
	return tokens, nil
}

// Authenticate verifies a bearer JWT of a configured issuer. A request
// without one (no token, not a JWT, an "iss" no issuer is configured for)
// gets an error wrapping authn.ErrNoCredentials, so the next authenticator
// has its turn. Otherwise the error wraps authn.ErrInvalidCredentials
// (signature, algorithm, times, audience, malformed claims),
// authn.ErrPermissionDenied (claim rules, template) or authn.ErrUnavailable
// (the issuer's keys cannot be had).
func (a *Authenticator) Authenticate(ctx context.Context, r authn.Request) (authn.Identity, error) {
	token := r.BearerToken
	switch {
	case token == "":
		return authn.Identity{}, noCredentials("no bearer token")
	case len(token) > authn.MaxTokenSize:
		return authn.Identity{}, noCredentials(fmt.Sprintf("bearer token is %d bytes, more than %d", len(token), authn.MaxTokenSize))
	}
	iss, ok := peekIssuer(token)
	if !ok {
		return authn.Identity{}, noCredentials("bearer token is not a JWT with an iss claim")
	}
	is := a.byIss[iss]
	if is == nil {
		return authn.Identity{}, noCredentials("bearer token's issuer is not a configured one")
	}
	id, exp, rf := a.authenticate(ctx, is, token)
	if rf != nil {
		a.tokens.WithLabelValues(is.cfg.Name, rf.result).Inc()
		return authn.Identity{}, fmt.Errorf("authn: oidc: issuer %s: %w: %w", is.cfg.Name, rf.err, rf.kind)
	}
	a.tokens.WithLabelValues(is.cfg.Name, resultAccepted).Inc()
	return authn.Identity{
		ID:       id,
		Method:   is.method,
		Grant:    &authn.Grant{Method: is.method, Ref: is.cfg.Name, UID: is.grantUID},
		NotAfter: exp,
	}, nil
}

// authenticate verifies token, then applies the claim rules and builds
// the identity.
func (a *Authenticator) authenticate(ctx context.Context, is *issuer, token string) (spiffeid.ID, time.Time, *refusal) {
	v, rf := is.verify(ctx, token, a.clk.Now())
	if rf != nil {
		return spiffeid.ID{}, time.Time{}, rf
	}
	var id spiffeid.ID
	if is.tmpl == nil {
		if id, rf = kubernetesID(a.td, v.claims); rf != nil {
			return spiffeid.ID{}, time.Time{}, rf
		}
	}
	if err := checkRulesHold(is.cfg.Claims, v.claims); err != nil {
		return spiffeid.ID{}, time.Time{}, refuse(resultRefusedRules, authn.ErrPermissionDenied, "%v", err)
	}
	if is.tmpl != nil {
		var err error
		if id, err = is.tmpl.execute(a.td, v.claims); err != nil {
			return spiffeid.ID{}, time.Time{}, refuse(resultRefusedTemplate, authn.ErrPermissionDenied, "%s: %v", keySPIFFEID, err)
		}
	}
	return id, v.exp, nil
}

func noCredentials(reason string) error {
	return fmt.Errorf("authn: oidc: %s: %w", reason, authn.ErrNoCredentials)
}

// peekIssuer reads "iss" from a compact JWS without verifying anything:
// it only picks the issuer whose keys will judge the token. The name is
// matched exactly ("ISS" is another claim) and must appear once, so the
// issuer picked is the one whose "iss" checkClaims compares.
func peekIssuer(token string) (string, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return "", false
	}
	claims, err := decodeExact(parts[1])
	if err != nil {
		return "", false
	}
	var iss *string
	if raw, ok := claims["iss"]; !ok || json.Unmarshal(raw, &iss) != nil || iss == nil {
		return "", false
	}
	return *iss, true
}

// Issuers returns the "iss" of every configured issuer, in configuration
// order: a TokenReview authenticator leaves tokens of these issuers alone.
func (a *Authenticator) Issuers() []string {
	out := make([]string, len(a.issuers))
	for i, is := range a.issuers {
		out[i] = is.cfg.Issuer
	}
	return out
}

// CheckGrant implements authn.GrantChecker: a grant stands while an issuer
// named g.Ref, of the kind g.Method says and with the issuer URL g.UID
// digests (authn.IssuerGrantUID), is configured (else ErrGrantRevoked),
// and for at most the issuer's MaxRenewalLifetime after g.GrantedAt (else
// authn.ErrGrantExpired). Removing an issuer from the configuration, or
// pointing its name at another URL, ends the renewal chains it started;
// the others end by age, because nothing about the token that started
// them can be checked again without a fresh one.
func (a *Authenticator) CheckGrant(_ context.Context, id spiffeid.ID, g authn.Grant) error {
	var want Kind
	switch g.Method {
	case authn.MethodOIDC:
		want = KindOIDC
	case authn.MethodKubernetesIssuer:
		want = KindKubernetes
	default:
		return fmt.Errorf("authn: oidc: %s: grant of method %q is not an issuer grant: %w", id, truncate(g.Method, 32), authn.ErrGrantRevoked)
	}
	is := a.byName[g.Ref]
	switch {
	case is == nil:
		return fmt.Errorf("authn: oidc: %s: issuer %q that granted it is no longer configured: %w", id, truncate(g.Ref, 64), authn.ErrGrantRevoked)
	case is.cfg.Kind != want:
		return fmt.Errorf("authn: oidc: %s: issuer %q is now of kind %s, not %s: %w", id, g.Ref, is.cfg.Kind, want, authn.ErrGrantRevoked)
	case g.UID != is.grantUID:
		return fmt.Errorf("authn: oidc: %s: issuer %q now has issuer URL %s, not the one that granted it: %w", id, g.Ref, is.cfg.Issuer, authn.ErrGrantRevoked)
	case a.clk.Since(g.GrantedAt) > is.cfg.MaxRenewalLifetime:
		return fmt.Errorf("authn: oidc: %s: granted at %s by issuer %q, longer ago than its %s of %s "+
			"(claim rules and remote service accounts cannot be re-checked offline, so a renewal chain goes back to a fresh token): %w",
			id, g.GrantedAt.UTC().Format(time.RFC3339), g.Ref, keyMaxRenewal, is.cfg.MaxRenewalLifetime, authn.ErrGrantExpired)
	}
	return nil
}

// GrantNotAfter is when certificates of g must end (authn.GrantBounder):
// its issuer's maxRenewalLifetime after the token that granted it. ok is
// false for a grant no configured issuer made (CheckGrant refuses it).
func (a *Authenticator) GrantNotAfter(g authn.Grant) (time.Time, bool) {
	is := a.byName[g.Ref]
	if is == nil || is.method != g.Method || g.UID != is.grantUID || g.GrantedAt.IsZero() {
		return time.Time{}, false
	}
	return g.GrantedAt.Add(is.cfg.MaxRenewalLifetime), true
}

// Run fetches every issuer's keys once (a warm-up, so the first token
// does not wait and a misconfigured issuer shows in the log at start),
// then waits for ctx. A failed warm-up is not fatal (the key set logs
// it): the keys are fetched again on first use.
func (a *Authenticator) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, is := range a.issuers {
		wg.Go(func() { a.warmUp(ctx, is) })
	}
	wg.Wait()
	<-ctx.Done()
	return nil
}

// warmUp fetches is's keys ahead of its first token. The key set logs
// each fetch's outcome itself, once per change of state
// (keySet.logStateLocked): a success is not logged here again.
func (a *Authenticator) warmUp(ctx context.Context, is *issuer) {
	if _, err := is.keys.Keys(ctx, ""); err != nil {
		a.logger.Debug("issuer key warm-up failed; keys are fetched again on first use",
			logattr.Issuer, is.cfg.Name, logattr.IssuerURL, is.cfg.Issuer, logattr.Error, err)
	}
}

// Status reports each issuer's keys, in configuration order.
func (a *Authenticator) Status() []IssuerStatus {
	out := make([]IssuerStatus, len(a.issuers))
	for i, is := range a.issuers {
		st := is.keys.Status()
		out[i] = IssuerStatus{
			Name: is.cfg.Name, Issuer: is.cfg.Issuer, Kind: is.cfg.Kind,
			Keys: st.Keys, LastFetch: st.LastFetch, LastSuccess: st.LastSuccess, LastError: st.LastError,
		}
	}
	return out
}
