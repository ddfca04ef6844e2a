package admin

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/federation/managed"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// Manager changes the federation at run time (managed.Manager, or the
// ClusterFederatedTrustDomain resources with Kubernetes storage).
// Its four methods are the relationship's create, update and delete
// (federation add, update, remove; bundle delete is a Remove of the
// bundle only) and the bundle's set.
type Manager interface {
	Add(ctx context.Context, ep federation.Endpoint, opts managed.AddOptions) error
	Update(ctx context.Context, td spiffeid.TrustDomain, edit managed.Edit, opts managed.AddOptions) error
	Remove(ctx context.Context, td spiffeid.TrustDomain, opts managed.RemoveOptions) error
	SetBundle(ctx context.Context, b *spiffebundle.Bundle, actor string) (kind string, err error)
}

// maxMutationBody bounds a request body: a bundle is at most
// bundledoc.DefaultMaxSize, and a federation entry holds one, escaped.
const maxMutationBody = 2*bundledoc.DefaultMaxSize + 64<<10

// ActorSocket names the operator of a request that came in on the admin
// socket, whose file mode is its authentication.
const ActorSocket = "admin-socket"

type socketKey struct{}

// OverSocket marks ctx as a connection of the admin socket (an
// http.Server's ConnContext): its requests may change state without the
// token.
func OverSocket(ctx context.Context) context.Context {
	return context.WithValue(ctx, socketKey{}, true)
}

func (h *Handler) manageRoutes() {
	h.mux.HandleFunc("GET /v1/federation/relationships", h.serveRelationships)
	if h.cfg.Manager == nil {
		return
	}
	h.mux.HandleFunc("POST /v1/federation/relationships", h.mutation(h.serveAdd))
	h.mux.HandleFunc("PATCH /v1/federation/relationships/{trust_domain}", h.mutation(h.serveUpdate))
	h.mux.HandleFunc("DELETE /v1/federation/relationships/{trust_domain}", h.mutation(h.serveRemove))
	h.mux.HandleFunc("PUT /v1/bundles/{trust_domain}", h.mutation(h.serveSetBundle))
	h.mux.HandleFunc("DELETE /v1/bundles/{trust_domain}", h.mutation(h.serveDeleteBundle))
}

// mutation guards a state-changing handler: no cross-site browser
// request, the admin token (compared in constant time) unless the request
// came in on the admin socket, and the leader only.
func (h *Handler) mutation(next func(http.ResponseWriter, *http.Request, string)) http.HandlerFunc {
	return refuseCrossSite(func(w http.ResponseWriter, r *http.Request) {
		actor, ok := h.authenticate(w, r)
		if !ok {
			return
		}
		if !h.isLeader() {
			// The leader records trust changes in the audit log; a change
			// made through a follower would go unrecorded.
			http.Error(w, "this replica is not the leader; make changes through the leader (see the trustbridge_leader metric), where they are audited", http.StatusConflict)
			return
		}
		next(w, r, actor)
	})
}

// authenticate names who asks, or answers 401 saying where the token is.
func (h *Handler) authenticate(w http.ResponseWriter, r *http.Request) (actor string, ok bool) {
	actor, bearer := h.credential(r)
	if actor != "" {
		return actor, true
	}
	h.unauthorized(w, bearer)
	return "", false
}

// credential names who asks: ActorSocket on the admin socket,
// "admin-token" with the right token, "" otherwise; bearer says a token
// was sent (a wrong one, when actor is "").
func (h *Handler) credential(r *http.Request) (actor string, bearer bool) {
	if r.Context().Value(socketKey{}) != nil {
		return ActorSocket, false
	}
	// The scheme is case-insensitive (RFC 9110 §11.1).
	scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	bearer = strings.EqualFold(scheme, "Bearer")
	want := h.cfg.Token
	if bearer && want != "" && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(want)) == 1 {
		return "admin-token", true
	}
	return "", bearer
}

// unauthorized answers 401 saying where the token is.
func (h *Handler) unauthorized(w http.ResponseWriter, bearer bool) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="trustbridge-admin"`)
	what := "missing admin token"
	if bearer {
		what = "wrong admin token"
	}
	http.Error(w, what+": send Authorization: Bearer <token>, the token the server wrote to "+h.cfg.TokenFile+
		" (trustbridge reads it with --data-dir or --admin-token-file)", http.StatusUnauthorized)
}

func (h *Handler) serveRelationships(w http.ResponseWriter, _ *http.Request) {
	out := []api.Relationship{}
	if h.cfg.Federation != nil {
		for _, st := range h.cfg.Federation.Status() {
			td, err := spiffeid.TrustDomainFromString(st.TrustDomain)
			if err != nil {
				continue
			}
			out = append(out, api.NewRelationship(st, h.origin(td)))
		}
	}
	if h.cfg.Static != nil {
		for _, td := range h.cfg.Static() {
			out = append(out, api.Relationship{TrustDomain: td.Name(), Origin: api.OriginStatic})
		}
	}
	writeJSON(w, out, true)
}

// serveAdd takes one entry in the --federation-config schema (JSON is
// YAML), with its bootstrap bundle inline (trustDomainBundle): the
// parser every other path uses. ?force replaces a managed endpoint;
// ?no_fetch skips the first fetch.
func (h *Handler) serveAdd(w http.ResponseWriter, r *http.Request, actor string) {
	body, ok := readBody(w, r, maxMutationBody)
	if !ok {
		return
	}
	cfg, err := federation.ParseConfig(body, nil)
	if err == nil && len(cfg.Endpoints) != 1 {
		err = fmt.Errorf("the body holds %d federation entries, want 1", len(cfg.Endpoints))
	}
	if err != nil {
		// The request is the one entry: its place in a file (line 1,
		// federation[0]) says nothing to whoever sent it.
		http.Error(w, entryPrefix.ReplaceAllString(err.Error(), ""), http.StatusBadRequest)
		return
	}
	q := r.URL.Query()
	ep := cfg.Endpoints[0]
	opts := managed.AddOptions{Force: q.Has("force"), NoProbe: q.Has("no_fetch"), Actor: actor}
	if err := h.cfg.Manager.Add(r.Context(), ep, opts); err != nil {
		http.Error(w, addRefusal(ep, err), statusOf(err))
		return
	}
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, "federated with %s by %s\n", ep.TrustDomain.Name(), ep)
	for _, warn := range cfg.Warnings {
		_, _ = fmt.Fprintf(w, "warning: %s\n", warn)
	}
}

// entryPrefix is what federation.ParseConfig puts before a refusal of a
// file's first entry (as federation/crd trims it for a resource's spec).
var entryPrefix = regexp.MustCompile(`^(federation: )?line \d+: federation\[0\]( \([^)]*\))?: `)

// addRefusal words a refused add for whoever runs trustbridge federation
// add. A self-serving peer whose bundle is neither given nor held needs
// --bundle, which the message written for every way of configuring
// federation (files, tuples, resources) does not name.
func addRefusal(ep federation.Endpoint, err error) string {
	if !errors.Is(err, federation.ErrNoBootstrapBundle) {
		return err.Error()
	}
	td := ep.TrustDomain.Name()
	return fmt.Sprintf("no bundle of %s held to authenticate the first fetch from its endpoint %s: "+
		"give %s's bundle with --bundle FILE, the file its operator makes with "+
		"`trustbridge bundle show -o spiffe > %s.json` (or `spire-server bundle show -format spiffe`) and sends you over a channel you trust",
		td, ep.EndpointSPIFFEID, td, td)
}

func (h *Handler) serveRemove(w http.ResponseWriter, r *http.Request, actor string) {
	td, ok := pathTrustDomain(w, r)
	if !ok {
		return
	}
	if err := h.cfg.Manager.Remove(r.Context(), td, managed.RemoveOptions{Actor: actor}); err != nil {
		http.Error(w, err.Error(), statusOf(err))
		return
	}
	_, _ = io.WriteString(w, "removed "+td.Name()+"; its bundle is no longer trusted\n")
}

// serveDeleteBundle removes a static bundle set with bundle set; a trust
// domain federated by an endpoint is refused (federation remove).
func (h *Handler) serveDeleteBundle(w http.ResponseWriter, r *http.Request, actor string) {
	td, ok := pathTrustDomain(w, r)
	if !ok {
		return
	}
	if err := h.cfg.Manager.Remove(r.Context(), td, managed.RemoveOptions{Actor: actor, BundleOnly: true}); err != nil {
		http.Error(w, err.Error(), statusOf(err))
		return
	}
	_, _ = io.WriteString(w, "deleted "+td.Name()+"'s static bundle; it is no longer trusted\n")
}

// serveSetBundle takes a SPIFFE bundle document or PEM certificates as
// the trust domain's bundle, refused as the poller refuses a fetched one
// (a certificate naming another trust domain, no CA).
func (h *Handler) serveSetBundle(w http.ResponseWriter, r *http.Request, actor string) {
	td, ok := pathTrustDomain(w, r)
	if !ok {
		return
	}
	body, ok := readBody(w, r, bundledoc.DefaultMaxSize)
	if !ok {
		return
	}
	b, warnings, err := bundledoc.ParseAny(td, body)
	if err == nil {
		err = federation.RefusedWarning(warnings)
	}
	if err != nil {
		http.Error(w, "bundle for "+td.Name()+": "+err.Error(), http.StatusBadRequest)
		return
	}
	kind, err := h.cfg.Manager.SetBundle(r.Context(), b, actor)
	if err != nil {
		http.Error(w, err.Error(), statusOf(err))
		return
	}
	what := "static bundle (trusted as is)"
	if kind == managed.KindBootstrap {
		// Once fetched, the endpoint's own bundle stays in force (the
		// federation spec): say so, lest an operator recovering from a
		// rotation believe these roots are now trusted.
		what = "bootstrap bundle (authenticates its endpoint's first fetch only: a bundle already fetched from it stays in force; to start over from this one, federation remove then add)"
	}
	_, _ = fmt.Fprintf(w, "set %s's %s: %d X.509 and %d JWT authorities\n", td.Name(), what, len(b.X509Authorities()), len(b.JWTAuthorities()))
	for _, warn := range warnings {
		_, _ = fmt.Fprintf(w, "warning: %s\n", warn)
	}
}

// readBody reads a request body of at most limit bytes, or answers 413
// (too large) or 400 (the read failed: a reset, a timeout).
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, bool) {
	body, err := bundledoc.ReadLimited(r.Body, limit)
	switch {
	case errors.Is(err, bundledoc.ErrTooLarge):
		http.Error(w, "request body: "+err.Error(), http.StatusRequestEntityTooLarge)
		return nil, false
	case err != nil:
		http.Error(w, "request body: "+err.Error(), http.StatusBadRequest)
		return nil, false
	}
	return body, true
}

func pathTrustDomain(w http.ResponseWriter, r *http.Request) (spiffeid.TrustDomain, bool) {
	name := r.PathValue("trust_domain")
	td, err := bundledoc.ParseTrustDomain(name)
	if err != nil {
		http.Error(w, fmt.Sprintf("trust domain %q: %v", name, err), http.StatusBadRequest)
		return td, false
	}
	return td, true
}

// statusOf maps the managed package's errors to HTTP.
func statusOf(err error) int {
	switch {
	case errors.Is(err, managed.ErrReserved), errors.Is(err, managed.ErrExists):
		return http.StatusConflict
	case errors.Is(err, managed.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, managed.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, managed.ErrFirstFetch):
		return http.StatusBadGateway
	default:
		return http.StatusInternalServerError
	}
}
