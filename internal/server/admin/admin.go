package admin

import (
	"time"

	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/authn/oidc"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
	"github.com/trustbridge/trustbridge/internal/server/statusui"
)

// Authority is the embedded CA as the admin API reads it (ca.Authority).
type Authority interface {
	// Bundle is the published bundle (sequence and refresh hint).
	Bundle() *spiffebundle.Bundle
	// Roots are the roots with their rotation state.
	Roots() []ca.RootInfo
	// Sequence is the published bundle's sequence number.
	Sequence() uint64
}

// Federation is the poller of federated trust domains (federation.Poller).
type Federation interface {
	Status() []federation.Status
	// Refresh polls td now.
	Refresh(ctx context.Context, td spiffeid.TrustDomain) error
}

// TrustStore is the trust store the snapshot and /v1/federation read
// (trust.Store).
type TrustStore interface {
	Snapshot() *trust.Snapshot
	// Sources names what contributes to td's bundle.
	Sources(td spiffeid.TrustDomain) []string
	// Published is each source's bundle as it set it.
	Published() *trust.Published
}

// Config is what the admin API serves.
type Config struct {
	// TrustDomain is the server's own trust domain.
	TrustDomain spiffeid.TrustDomain
	// CA is required.
	CA Authority
	// Ready reports readiness for /readyz; nil is always ready.
	Ready func() error
	// Warning, when it returns an error while Ready is nil, is shown on
	// /readyz after "ok": a problem that does not stop serving but that
	// operators must see (an upstream authority failing while the
	// intermediate still signs). The status stays 200: probes keep the
	// replica in service.
	Warning func() error
	// Gatherer is served at /metrics; nil serves an empty registry.
	Gatherer prometheus.Gatherer
	// Federation is nil when no federation is configured: leave it unset
	// rather than holding a nil *federation.Poller, which is not nil here.
	Federation Federation
	// Trust, when set, mounts /v1/snapshot and /ui.
	Trust TrustStore
	// Origin says where a federated trust domain is configured ("flag",
	// "file", "crd:<name>"); nil says nothing.
	Origin func(spiffeid.TrustDomain) string
	// Actor names this replica in snapshots.
	Actor string
	// KeyManager names the CA's key manager (--key-manager) for the
	// snapshot's key_storage of keys held there; "" for none.
	KeyManager string
	// RequireHSM is --require-hsm, reported in the snapshot for audits.
	RequireHSM bool
	// WorkloadTTL and MaxWorkloadTTL are the CA's leaf lifetimes, and
	// Upstream its upstream's health (ca.Authority.Upstream; nil or !ok
	// outside upstream mode), for the snapshot's ca section.
	WorkloadTTL, MaxWorkloadTTL time.Duration
	Upstream                    func() (ca.UpstreamStatus, bool)
	// IsLeader reports whether this replica leads; nil: a single server,
	// always. Only the leader polls and saves bundles, so a follower
	// refuses refreshes: it would fetch and then fail to save.
	IsLeader func() bool
	// Clock dates snapshots and paces refreshes; nil is the real clock.
	Clock clock.PassiveClock
	// Manager, when set, mounts the routes that change the federation at
	// run time; they need Token (or the admin socket, OverSocket).
	Manager Manager
	// Token is the admin token mutations must bear; "" refuses every
	// request that is not on the admin socket.
	Token string
	// TokenFile names where Token is, for the 401 message.
	TokenFile string
	// Static lists the trust domains trusted by a static bundle.
	Static func() []spiffeid.TrustDomain
	// Policy, with Trust, adds the trust policy to /v1/snapshot and /ui
	// and mounts GET /v1/policy/explain; nil: no trust policy wiring.
	Policy *PolicyConfig
	// IdentityMap, when set, adds the identity map to /v1/snapshot and
	// mounts GET /v1/identity/explain; nil: the server has none.
	IdentityMap *IdentityMapConfig
	// JWT, when set, adds the CA's JWT signing keys and their rotation
	// state to /v1/trust, /v1/snapshot and /ui, and marks the local trust
	// domain as a JWT-SVID issuer when it reports any; nil shows the
	// bundle's JWT authorities without state.
	JWT JWTKeys
	// Issuers, when set, mounts GET /v1/authn/issuers: the OIDC and
	// remote Kubernetes issuers whose tokens authenticate callers, with
	// the state of their keys.
	Issuers func() []oidc.IssuerStatus
	// JWTIssuers, when set, adds the OIDC issuers of JWT-SVIDs the server
	// names (--jwt-issuer, --relay-jwt-issuer) to /v1/trust, /v1/snapshot
	// and /ui: not Issuers, whose tokens authenticate callers.
	JWTIssuers func() []api.OIDCIssuerStatus
	// Authorities, when set, mounts GET /v1/ca/authorities (the CA's
	// signing authorities, `trustbridge ca authority list`) and POST
	// /v1/ca/authorities (prepare, activate, taint and revoke one: a
	// mutation, so Token or the admin socket, on the leader).
	Authorities Authorities
	// Signed, when set, adds to each authority of /v1/ca/authorities what
	// it signed that is still valid: counts keyed by api.SignedKey
	// ("x509:<subject key id hex>", "jwt:<kid>"; a missing key counts
	// zero), and since when they run (this replica's start). Revoke is
	// then refused while an authority's InUse is not zero, unless forced.
	// Nil: nothing is counted and revoke is not held back.
	Signed func() (map[string]api.SignedCount, time.Time)
	// Revocations, when set, are the authorities the CA revoked, named in
	// GET /v1/bundle as the bundle endpoint names them, so that a peer
	// bootstrapped from it refuses them too.
	Revocations func() []bundledoc.Revocation
	// SignedIncomplete, when set, says why every count of Signed may be
	// short (the ledger had to drop entries); "" when none is.
	SignedIncomplete func() string
	// Fetchers, when set, lists the clients of our bundle endpoint with
	// their last fetch, served at GET /v1/bundle/fetchers: activate names
	// those that fetched before the authority was published, and `ca
	// drill` waits for them to fetch the revocation. Nil: activate says
	// fetches are not tracked, and /v1/bundle/fetchers answers 404.
	Fetchers func() []api.BundleFetcher
	// LogLevel, when set, mounts GET and PUT /v1/log/level: the level of
	// the server's logs, changed at run time (audited when Audit is set).
	LogLevel *slog.LevelVar
	// ReloadTokens, when set, mounts POST /v1/bootstrap-tokens/reload:
	// re-read --bootstrap-token-file now, answering how many tokens are in
	// force and what changed (trustbridge token revoke); audited
	// (bootstrap_tokens_reloaded) when Audit is set.
	ReloadTokens func() (api.TokenReload, error)
	// Audit, when set, records each change made through
	// /v1/log/level (log_level_changed) and /v1/ca/authorities (ca_authority_* events, with who asked in
	// Reason); the server's audit trail sets the entry's Actor and
	// chain.
	Audit func(audit.Entry)
	// Mint, when set, mounts POST /v1/svid/x509 and /v1/svid/jwt: an
	// operator's SVID for an identity of the trust domain (`x509 mint`,
	// `jwt mint --spiffe-id`), guarded as the other mutations are and
	// audited through Audit.
	Mint Minter
	// ClusterTrustBundles, when set, is the leader's ClusterTrustBundle
	// distribution for the snapshot (nil on followers).
	ClusterTrustBundles func() *api.ClusterTrustBundles
	// Reserved are the server's own identities (its certificate service
	// and bundle endpoint): Mint refuses them, so that the admin token
	// cannot make a credential peers and agents take for the server.
	Reserved []spiffeid.ID
	// ReservedPath is the path under which the server names its own
	// identities ("/trustbridge"): Mint refuses it and every ID under it,
	// whichever of them the server uses now.
	ReservedPath string
	// ReservedDNSNames are the host names the server serves under (its
	// certificate service, bundle endpoint, admin listener): Mint refuses
	// an X509-SVID naming one of them, or a wildcard covering one, so that
	// the SVID cannot pose as the server to clients checking host names.
	ReservedDNSNames []string
}

// Handler serves the admin API.
type Handler struct {
	cfg     Config
	mux     *http.ServeMux
	refresh rateLimit
}

// New returns the admin API of cfg. A nil cfg.CA is a programming error
// and panics.
func New(cfg Config) *Handler {
	if cfg.CA == nil {
		panic("admin: nil CA")
	}
	if cfg.Gatherer == nil {
		cfg.Gatherer = prometheus.NewRegistry()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux(), refresh: rateLimit{clock: cfg.Clock}}
	h.routes()
	return h
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

func (h *Handler) routes() {
	h.mux.HandleFunc("GET /v1/federation", h.serveFederation)
	h.mux.HandleFunc("POST /v1/federation/refresh", refuseCrossSite(h.serveRefresh))
	if h.cfg.Trust != nil {
		h.mux.HandleFunc("GET /v1/snapshot", h.serveSnapshot)
		// Not "GET /ui": the page answers other methods itself, with its
		// security headers.
		h.mux.Handle("/ui", statusui.Handler(h.Snapshot, audit.Findings))
		if h.cfg.Policy != nil {
			h.mux.HandleFunc("GET /v1/policy/explain", h.servePolicyExplain)
		}
	}
	if h.cfg.IdentityMap != nil {
		h.mux.HandleFunc("GET /v1/identity/explain", h.serveIdentityExplain)
	}
	addProbes(h.mux, h.cfg.Ready, h.cfg.Warning, h.cfg.Gatherer)
	h.mux.HandleFunc("GET /v1/trust", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, h.Trust(), true)
	})
	h.mux.HandleFunc("GET /v1/bundle", h.serveBundle)
	h.mux.HandleFunc("GET /v1/bundle/fetchers", h.serveFetchers)
	if h.cfg.Issuers != nil {
		h.mux.HandleFunc("GET /v1/authn/issuers", h.serveIssuers)
	}
	h.manageRoutes()
	h.authorityRoutes()
	h.mintRoutes()
	h.runtimeRoutes()
}

// serveBundle answers the local trust domain's SPIFFE bundle document, as
// the bundle endpoint serves it: what an https_spiffe peer's operator
// needs once, out of band, to authenticate the first fetch (the banner's
// "bootstrap:" line). Public material; the admin listener is where an
// operator can reach it without trusting the network for it.
func (h *Handler) serveBundle(w http.ResponseWriter, _ *http.Request) {
	var revs []bundledoc.Revocation
	if h.cfg.Revocations != nil {
		revs = h.cfg.Revocations()
	}
	doc, err := bundledoc.MarshalWithRevocations(h.cfg.CA.Bundle(), revs)
	if err != nil {
		http.Error(w, "bundle: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(doc, '\n'))
}

// Probes serves only GET /healthz, /readyz (503 with the reason while
// ready, which may be nil, fails) and /metrics from g: the admin listener
// of a process that has no trust domain to show, trustbridge agent.
func Probes(ready func() error, g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	addProbes(mux, ready, nil, g)
	return mux
}

func addProbes(mux *http.ServeMux, ready, warning func() error, g prometheus.Gatherer) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { serveReady(w, ready, warning) })
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
}

func serveReady(w http.ResponseWriter, ready, warning func() error) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if ready != nil {
		if err := ready(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "not ready: "+err.Error()+"\n")
			return
		}
	}
	if warning != nil {
		if err := warning(); err != nil {
			_, _ = io.WriteString(w, "ok (warning: "+err.Error()+")\n")
			return
		}
	}
	_, _ = io.WriteString(w, "ok\n")
}

// isLeader is whether this replica writes trust changes.
func (h *Handler) isLeader() bool { return h.cfg.IsLeader == nil || h.cfg.IsLeader() }

// writeJSON writes v as the JSON answer, indented when asked.
func writeJSON(w http.ResponseWriter, v any, indent bool) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	if indent {
		enc.SetIndent("", "  ")
	}
	_ = enc.Encode(v)
}
