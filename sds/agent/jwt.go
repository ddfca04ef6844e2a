package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
)

// Limits of the JWT-SVID cache.
const (
	maxCachedJWTs  = 1000
	jwtCallTimeout = 30 * time.Second
)

// Each workload of a node agent may have jwtMintRate JWT-SVIDs minted per
// second, in bursts of up to jwtMintBurst; tokens served from the cache
// cost nothing. A workload asking for a new audience per request must not
// spend the node's share of the server's signing (the server charges the
// node, not each workload), nor push every other workload's tokens out of
// the cache. A start-up naming twenty services fits in the burst.
const (
	jwtMintRate  = rate.Limit(2)
	jwtMintBurst = 20
)

// jwtMinter mints JWT-SVIDs with the identity service's MintJWTSVIDs
// (mints asked at once go in one call; caclient.JWTBatcher) over mTLS as
// the workload, and reuses a token for the same audience set
// until half its lifetime passed, so a workload asking per request does
// not become a signing per request upstream.
type jwtMinter struct {
	addr  string
	tls   func() *tls.Config
	clock clock.Clock

	mu   sync.Mutex
	conn *grpc.ClientConn // nil until the first call
	// batcher mints on conn, coalescing the mints asked for at once
	// (a node's workloads starting together) into one call.
	batcher *caclient.JWTBatcher
	// shared: conn is a node agent's connection, not the minter's to
	// close.
	shared bool
	cache  map[string]cachedJWT
	// limits are the node's workloads' mint budgets (MintJWTSVIDFor);
	// log tells of a workload over its budget.
	limits mintLimits
	log    *slog.Logger
	// closed is set by close: a call still running during shutdown must
	// not open a connection nobody closes.
	closed bool
	// taints, when set, are the tainted authorities: a cached token whose
	// kid is tainted is never served again (followTaints).
	taints *taintCell
}

// errMinterClosed is what a call gets once the agent is stopping.
var errMinterClosed = errors.New("the agent is stopping; no JWT-SVIDs are minted")

type cachedJWT struct {
	token            string
	refreshAt, expAt time.Time
	// kid is the token's header kid: the key that signed it.
	kid string
}

func newJWTMinter(addr string, tlsConfig func() *tls.Config, c clock.Clock) *jwtMinter {
	return &jwtMinter{addr: addr, tls: tlsConfig, clock: c, cache: make(map[string]cachedJWT)}
}

// newNodeJWTMinter mints the JWT-SVIDs of a node agent's workloads on
// conn, the node's connection (authenticated by its token), each for the
// workload it names.
func newNodeJWTMinter(conn *grpc.ClientConn, c clock.Clock, log *slog.Logger) *jwtMinter {
	return &jwtMinter{conn: conn, batcher: caclient.NewJWTBatcher(conn), shared: true, clock: c, cache: make(map[string]cachedJWT), log: log,
		limits: mintLimits{m: make(map[spiffeid.ID]*rate.Limiter), warn: ratelimit.NewLogLimiter(jwtLimitLogEvery, 1)}}
}

// MintJWTSVID returns a cached token for the audience set while it is in
// the first half of its lifetime, else mints one.
func (m *jwtMinter) MintJWTSVID(ctx context.Context, audience []string) (string, error) {
	return m.mint(ctx, audienceKey(audience), nil, func(ctx context.Context, b *caclient.JWTBatcher) (*caclient.JWTSVID, error) {
		return b.Mint(ctx, spiffeid.ID{}, audience, 0)
	})
}

// MintJWTSVIDFor is MintJWTSVID for workload id, which a node agent acts
// for (sds/workload's CallerJWTMinter): the server mints it as it grants
// the workload's certificate, and the token is cached per workload.
func (m *jwtMinter) MintJWTSVIDFor(ctx context.Context, id spiffeid.ID, audience []string) (string, error) {
	// A zero ID would ask the batcher for the node's own token.
	if id.IsZero() || id.Path() == "" {
		return "", fmt.Errorf("%q is not a SPIFFE ID of a workload", id.String())
	}
	charge := func(now time.Time) error { return m.limits.charge(ctx, id, now, m.log) }
	return m.mint(ctx, id.String()+"|"+audienceKey(audience), charge, func(ctx context.Context, b *caclient.JWTBatcher) (*caclient.JWTSVID, error) {
		return b.Mint(ctx, id, audience, 0)
	})
}

// mint returns the token cached under key while it is in the first half
// of its lifetime, else one call mints, once charge (when not nil) lets
// it.
func (m *jwtMinter) mint(ctx context.Context, key string, charge func(time.Time) error, call func(context.Context, *caclient.JWTBatcher) (*caclient.JWTSVID, error)) (string, error) {
	now := m.clock.Now()
	m.mu.Lock()
	c, ok := m.cache[key]
	m.mu.Unlock()
	if ok && now.Before(c.refreshAt) && !m.tainted(c.kid) {
		return c.token, nil
	}
	if charge != nil {
		if err := charge(now); err != nil {
			return "", err
		}
	}
	b, err := m.client()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, jwtCallTimeout)
	defer cancel()
	svid, err := call(ctx, b)
	if err != nil {
		return "", err
	}
	exp := svid.ExpiresAt
	if !exp.After(now) {
		return "", errors.New("the certificate service minted a JWT-SVID that has already expired (clock skew?)")
	}
	m.store(key, cachedJWT{token: svid.Token, refreshAt: now.Add(exp.Sub(now) / 2), expAt: exp, kid: jwtsvid.KeyID(svid.Token)}, now)
	return svid.Token, nil
}

// store caches c under key, first dropping expired tokens and, when the
// cache is still full, an arbitrary one.
func (m *jwtMinter) store(key string, c cachedJWT, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.cache) >= maxCachedJWTs {
		for k, v := range m.cache {
			if !now.Before(v.expAt) {
				delete(m.cache, k)
			}
		}
	}
	for k := range m.cache {
		if len(m.cache) < maxCachedJWTs {
			break
		}
		delete(m.cache, k)
	}
	m.cache[key] = c
}

// client is the batcher on the minter's connection, dialled on first
// use unless the node agent's was given.
func (m *jwtMinter) client() (*caclient.JWTBatcher, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errMinterClosed
	}
	if m.conn != nil {
		return m.batcher, nil
	}
	conn, err := caclient.Dial(m.addr, m.tls(), "")
	if err != nil {
		return nil, err
	}
	m.conn, m.batcher = conn, caclient.NewJWTBatcher(conn)
	return m.batcher, nil
}

func (m *jwtMinter) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	if m.conn != nil && !m.shared {
		m.conn.Close()
	}
	m.conn, m.batcher = nil, nil
}

// audienceKey is the audience set, order and repeats ignored, each
// audience length-prefixed so that no two sets share a key whatever
// bytes the audiences hold.
func audienceKey(aud []string) string {
	s := slices.Clone(aud)
	slices.Sort(s)
	var b strings.Builder
	for _, a := range slices.Compact(s) {
		b.WriteString(strconv.Itoa(len(a)))
		b.WriteByte(':')
		b.WriteString(a)
	}
	return b.String()
}

// jwtLimitLogEvery spaces the lines telling of workloads over their mint
// budget.
const jwtLimitLogEvery = time.Minute

// mintLimits are the JWT-SVID mint budgets of a node agent's workloads,
// one token bucket per identity, at most maxCachedJWTs of them.
type mintLimits struct {
	mu   sync.Mutex
	m    map[spiffeid.ID]*rate.Limiter
	warn *ratelimit.LogLimiter
}

// charge takes one mint from id's budget, or refuses it with
// ResourceExhausted saying what to do.
func (l *mintLimits) charge(ctx context.Context, id spiffeid.ID, now time.Time, log *slog.Logger) error {
	if l.allow(id, now) {
		return nil
	}
	if log != nil {
		log.Log(ctx, l.warn.Level(slog.LevelWarn), "a workload asks for more new JWT-SVIDs than its budget; refusing the excess",
			logattr.SPIFFEID, id.String(), "per_second", float64(jwtMintRate), "burst", jwtMintBurst)
	}
	return status.Errorf(codes.ResourceExhausted,
		"%s asked for more than %v new JWT-SVIDs per second (bursts of %d); reuse a token for its audience until half its lifetime passed (the agent serves it from its cache) and retry later",
		id, float64(jwtMintRate), jwtMintBurst)
}

func (l *mintLimits) allow(id spiffeid.ID, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	lim := l.m[id]
	if lim == nil {
		if len(l.m) >= maxCachedJWTs {
			l.pruneLocked(now)
		}
		lim = rate.NewLimiter(jwtMintRate, jwtMintBurst)
		l.m[id] = lim
	}
	return lim.AllowN(now, 1)
}

// pruneLocked forgets the budgets that are full again, which a new
// bucket would equal; when none is, an arbitrary one (there are as many
// identities as the cache holds, so this takes a thousand workloads
// minting at once). l.mu is held.
func (l *mintLimits) pruneLocked(now time.Time) {
	for id, lim := range l.m {
		if lim.TokensAt(now) >= jwtMintBurst {
			delete(l.m, id)
		}
	}
	for id := range l.m {
		if len(l.m) < maxCachedJWTs {
			break
		}
		delete(l.m, id)
	}
}

// followTaints makes m drop, and never serve again, the cached tokens
// signed by a key of c's taint sets, so the next request mints one from
// the CA's new key.
func (m *jwtMinter) followTaints(c *taintCell) {
	m.mu.Lock()
	m.taints = c
	m.mu.Unlock()
	c.follow(m.dropTainted)
}

// tainted tells whether kid is a tainted key of the set in force.
func (m *jwtMinter) tainted(kid string) bool {
	m.mu.Lock()
	c := m.taints
	m.mu.Unlock()
	if c == nil {
		return false
	}
	set := c.get()
	return caclient.TaintedKeyID(kid, set.authorities)
}

// dropTainted drops the cached tokens whose kid set taints and returns
// how many. A taintFollower.
func (m *jwtMinter) dropTainted(set taintSet) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, c := range m.cache {
		if caclient.TaintedKeyID(c.kid, set.authorities) {
			delete(m.cache, k)
			n++
		}
	}
	return n
}
