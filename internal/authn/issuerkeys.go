package authn

import (
	"context"
	"crypto/ecdsa"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/logattr"
)

// Service account issuer discovery (KEP-1393): kube-apiserver serves an
// OpenID configuration whose jwks_uri lists the public keys that sign
// service account tokens. Reading them through the API server's own REST
// client (so with our credentials and its CA) lets a token whose
// signature does not verify be refused without a TokenReview.
const (
	discoveryPath = "/.well-known/openid-configuration"
	// defaultJWKSPath is where kube-apiserver serves the keys, used when
	// the configuration's jwks_uri has no usable path.
	defaultJWKSPath = "/openid/v1/jwks"
	// maxDiscoveryBody and maxJWKSBody bound what is read; a cluster's
	// key set is a few keys of a few hundred bytes each.
	maxDiscoveryBody = 64 << 10
	maxJWKSBody      = 256 << 10
	// maxIssuerKeys bounds the keys kept, and so the signature checks one
	// token without a kid can cost.
	maxIssuerKeys = 32
	// DefaultKeysRefreshInterval is the least time between two fetches of
	// the issuer's keys: a token with an unknown kid (a key rotated in)
	// triggers at most one fetch per interval, however many arrive.
	DefaultKeysRefreshInterval = 30 * time.Second
	// keysFetchTimeout bounds one fetch of both documents.
	keysFetchTimeout = 5 * time.Second
)

// FetchFunc GETs path on the API server and returns at most limit bytes of
// a successful response's body; an error otherwise.
type FetchFunc func(ctx context.Context, path string, limit int64) ([]byte, error)

// issuerKeys holds the service account issuer's public keys. It never
// blocks a caller for longer than one fetch, and fetches at most once per
// interval.
type issuerKeys struct {
	fetch    FetchFunc // nil: off
	clk      clock.PassiveClock
	interval time.Duration
	logger   *slog.Logger

	mu        sync.Mutex
	keys      []jose.JSONWebKey // empty: none known (never fetched, or unavailable)
	attempted time.Time         // last fetch started; zero: never
	fetched   time.Time         // start of the last fetch that succeeded: keys are as of then
	fetching  chan struct{}     // closed when the fetch in progress ends; nil: none
	lastErr   error             // of the last fetch; logged at Warn once per change of state
	reported  bool              // whether the current state was logged
}

func newIssuerKeys(fetch FetchFunc, clk clock.PassiveClock, interval time.Duration, logger *slog.Logger) *issuerKeys {
	return &issuerKeys{fetch: fetch, clk: clk, interval: interval, logger: logger}
}

// verifyOutcome is what a local signature check concluded.
type verifyOutcome int

const (
	sigUnverifiable verifyOutcome = iota // no keys: leave it to TokenReview
	sigVerified
	sigRefused
	sigNotYet // signed by a key newer than the keys held, and no fetch allowed yet: retry
)

// verify checks token's signature against the issuer's keys. With no keys
// (discovery off or unavailable) the token is unverifiable, and the
// TokenReview alone decides. A kid the keys do not hold makes one fetch,
// at most once per interval; if it is still unknown the token is refused.
func (k *issuerKeys) verify(ctx context.Context, token string, lt localToken) (verifyOutcome, *localRefusal) {
	if k == nil || k.fetch == nil {
		return sigUnverifiable, nil
	}
	keys := k.current(ctx, false)
	if len(keys) == 0 {
		return sigUnverifiable, nil
	}
	cands := keysFor(keys, lt.kid)
	if len(cands) == 0 {
		keys = k.current(ctx, true)
		if cands = keysFor(keys, lt.kid); len(cands) == 0 {
			if len(keys) == 0 {
				return sigUnverifiable, nil
			}
			// Keys fetched after the token was issued would hold its key:
			// it is not one. A token issued after them may be signed by a
			// key rotated in since, which the next allowed fetch brings;
			// the caller is told to retry, not refused for good, so junk
			// key ids that keep a fetch recent cannot lock out a rotation.
			// iat has whole seconds and the API server's clock: a token
			// issued within kidIssuedSkew before the fetch may still be
			// newer than the keys.
			if k.fetchedAt().Before(lt.iat.Add(kidIssuedSkew)) {
				return sigNotYet, refuseLocal(localRefusedKey, "token key id %q is not one of the issuer's %d keys yet (keys from %s; the next fetch is at most %s away)",
					truncate(lt.kid, 64), len(keys), k.fetchedAt().UTC().Format(time.RFC3339), k.interval)
			}
			return sigRefused, refuseLocal(localRefusedKey, "token key id %q is not one of the issuer's %d keys", truncate(lt.kid, 64), len(keys))
		}
	}
	jws, err := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{jose.SignatureAlgorithm(lt.alg)})
	if err != nil {
		return sigRefused, refuseLocal(localRefusedSignature, "token signature: %v", err)
	}
	for i := range cands {
		if _, err := jws.Verify(&cands[i]); err == nil {
			return sigVerified, nil
		}
	}
	return sigRefused, refuseLocal(localRefusedSignature, "token signature does not verify with the issuer's keys")
}

// kidIssuedSkew is how much earlier than a key fetch a token may say it
// was issued and still be taken as possibly signed by a key the fetch
// missed: iat's whole seconds and clock differences between trustbridge
// and the API server.
const kidIssuedSkew = 5 * time.Second

// fetchedAt is when the fetch that brought the keys held started.
func (k *issuerKeys) fetchedAt() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.fetched
}

// keysFor returns the keys a token with kid may be signed with: those with
// that kid, or all when the token names none.
func keysFor(keys []jose.JSONWebKey, kid string) []jose.JSONWebKey {
	if kid == "" {
		return keys
	}
	var out []jose.JSONWebKey
	for _, k := range keys {
		if k.KeyID == kid {
			out = append(out, k)
		}
	}
	return out
}

// current returns the keys, fetching them first when none were ever
// fetched, or when stale is set (a kid was not found), unless a fetch
// started less than an interval ago. Callers arriving during a fetch wait
// for it.
func (k *issuerKeys) current(ctx context.Context, stale bool) []jose.JSONWebKey {
	k.mu.Lock()
	now := k.clk.Now()
	due := k.attempted.IsZero() || (stale && now.Sub(k.attempted) >= k.interval) ||
		(len(k.keys) == 0 && now.Sub(k.attempted) >= k.interval)
	wait := k.fetching
	switch {
	case wait == nil && due:
		wait = make(chan struct{})
		k.fetching = wait
		k.attempted = now
		k.mu.Unlock()
		k.refresh(ctx, wait)
		k.mu.Lock()
	case wait != nil && (stale || len(k.keys) == 0):
		// The fetch in progress may bring the key this caller needs;
		// callers whose key is known do not wait for it.
		k.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
		}
		k.mu.Lock()
	}
	defer k.mu.Unlock()
	return k.keys
}

// refresh fetches the keys and closes done. A failed fetch keeps the keys
// already known: a rotation that removed one is caught by TokenReview.
func (k *issuerKeys) refresh(ctx context.Context, done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keysFetchTimeout)
	defer cancel()
	keys, err := k.load(ctx)
	k.mu.Lock()
	defer k.mu.Unlock()
	defer close(done)
	k.fetching = nil
	changed := (err == nil) != (k.lastErr == nil) || !k.reported
	k.lastErr = err
	if err == nil {
		k.keys, k.fetched = keys, k.attempted
	}
	if !changed {
		k.logger.Debug("service account issuer keys fetched", "keys", len(k.keys), logattr.Error, err)
		return
	}
	k.reported = true
	if err != nil {
		k.logger.Warn("service account issuer discovery unavailable: tokens are checked by TokenReview alone (grant get on nonResourceURLs "+
			discoveryPath+" and "+defaultJWKSPath+", e.g. ClusterRole system:service-account-issuer-discovery, to check signatures locally)",
			"keys_kept", len(k.keys), logattr.Error, err)
		return
	}
	k.logger.Info("service account token signatures are checked against the issuer's keys before any TokenReview", "keys", len(keys))
}

// load fetches the discovery document, then its key set.
func (k *issuerKeys) load(ctx context.Context) ([]jose.JSONWebKey, error) {
	body, err := k.fetch(ctx, discoveryPath, maxDiscoveryBody)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", discoveryPath, err)
	}
	path, err := jwksPath(body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", discoveryPath, err)
	}
	body, err = k.fetch(ctx, path, maxJWKSBody)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	keys, err := ParseJWKS(body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return keys, nil
}

// jwksPath reads jwks_uri from an OpenID configuration and keeps its path
// only: the keys are fetched from the API server that served the
// configuration, whatever host the issuer URL names (it may be an
// external address this server cannot, or must not, reach).
func jwksPath(doc []byte) (string, error) {
	var cfg struct {
		JWKSURI string `json:"jwks_uri"`
	}
	if err := json.Unmarshal(doc, &cfg); err != nil {
		return "", fmt.Errorf("openid configuration: %w", err)
	}
	u, err := url.Parse(cfg.JWKSURI)
	if err != nil || !strings.HasPrefix(u.Path, "/") || strings.Contains(u.Path, "..") {
		return defaultJWKSPath, nil
	}
	return u.Path, nil
}

// ParseJWKS reads a JWK set element by element: go-jose fails a whole
// set on one key type it does not know, and one odd key must not turn
// local checks off. Kept: public RSA (2048 to 8192 bits, e=65537) and
// ECDSA (P-256, P-384, P-521) keys whose use is "sig" or empty, at most
// 32. A set with none is an error. Both the in-cluster issuer's keys and
// remote OIDC issuers' keys (internal/authn/oidc) are read with it.
func ParseJWKS(body []byte) ([]jose.JSONWebKey, error) {
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(body, &set); err != nil {
		return nil, fmt.Errorf("key set: %w", err)
	}
	var keys []jose.JSONWebKey
	for _, raw := range set.Keys {
		var k jose.JSONWebKey
		if err := k.UnmarshalJSON(raw); err != nil || !usableIssuerKey(&k) {
			continue
		}
		if keys = append(keys, k); len(keys) == maxIssuerKeys {
			break
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("key set has no usable public signing key")
	}
	return keys, nil
}

// usableIssuerKey accepts public signing keys of the types kube-apiserver
// uses. RSA keys up to 8192 bits are accepted here, unlike client
// certificates: they come from the API server, not from a caller.
func usableIssuerKey(k *jose.JSONWebKey) bool {
	if !k.Valid() || !k.IsPublic() || (k.Use != "" && k.Use != "sig") {
		return false
	}
	switch pub := k.Key.(type) {
	case *rsa.PublicKey:
		n := pub.N.BitLen()
		return n >= minRSABits && n <= 8192 && pub.E == rsaExponent
	case *ecdsa.PublicKey:
		return true
	}
	return false
}

// count is the number of keys known, for the metric.
func (k *issuerKeys) count() int {
	if k == nil {
		return 0
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.keys)
}

// RESTFetch is a FetchFunc over a Kubernetes REST client, normally
// clientset.Discovery().RESTClient(): the API server's address,
// credentials and CA, and its client-side rate limiter. A status other
// than 2xx is an error (client-go's Stream checks it); a body over limit
// is an error rather than a truncated document.
func RESTFetch(c rest.Interface) FetchFunc {
	return func(ctx context.Context, path string, limit int64) ([]byte, error) {
		body, err := c.Get().AbsPath(path).Stream(ctx)
		if err != nil {
			return nil, err
		}
		defer body.Close()
		b, err := io.ReadAll(io.LimitReader(body, limit+1))
		if err != nil {
			return nil, err
		}
		if int64(len(b)) > limit {
			return nil, fmt.Errorf("response larger than %d bytes", limit)
		}
		return b, nil
	}
}
