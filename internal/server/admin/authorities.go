package admin

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
)

// Authorities is the embedded CA as `trustbridge ca authority` changes
// it (ca.Authority): prepare, activate, taint and revoke its signing
// authorities, and list them with their state.
type Authorities interface {
	ChangeAuthority(c ca.AuthorityChange) (id string, err error)
	Roots() []ca.RootInfo
	JWTKeys() []ca.JWTKeyInfo
}

// maxAuthorityBody bounds POST /v1/ca/authorities: a few short fields.
const maxAuthorityBody = 4 << 10

// Actions of POST /v1/ca/authorities (ca.AuthorityChange.Action).
const (
	actionPrepare  = "prepare"
	actionActivate = "activate"
	actionTaint    = "taint"
	actionRevoke   = "revoke"
)

func (h *Handler) authorityRoutes() {
	if h.cfg.Authorities == nil {
		return
	}
	h.mux.HandleFunc("GET /v1/ca/authorities", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, h.CAAuthorities(), true)
	})
	h.mux.HandleFunc("POST /v1/ca/authorities", h.mutation(h.serveAuthorityChange))
}

// CAAuthorities is GET /v1/ca/authorities: the CA's X.509 authorities
// and JWT keys with their state and, with Config.Signed, what each signed
// that is still valid. It needs Config.Authorities.
func (h *Handler) CAAuthorities() api.CAAuthorities {
	out := api.CAAuthorities{TrustDomain: h.cfg.TrustDomain.Name(), Sequence: h.cfg.CA.Sequence(),
		X509: []api.CAAuthority{}, JWT: []api.CAAuthority{}}
	var signed map[string]api.SignedCount
	if h.cfg.Signed != nil {
		var since time.Time
		signed, since = h.cfg.Signed()
		since = since.UTC()
		out.SignedSince = &since
	}
	hint, shared := h.refreshHint(), h.incompleteEverywhere()
	for _, r := range h.cfg.Authorities.Roots() {
		out.X509 = append(out.X509, h.withIncomplete(withSigned(api.RootCAAuthority(r, hint), signed, h.cfg.Signed != nil), out.SignedSince, h.cfg.MaxWorkloadTTL, shared))
	}
	for _, k := range h.cfg.Authorities.JWTKeys() {
		out.JWT = append(out.JWT, h.withIncomplete(withSigned(api.JWTCAAuthority(k, hint), signed, h.cfg.Signed != nil), out.SignedSince, 0, shared))
	}
	return out
}

// signedFrom is when a began signing: its activation, or, for one that
// signed without an activation on record (retired, or active), its
// preparation; nil for one that never signed.
func signedFrom(a api.CAAuthority) *time.Time {
	switch {
	case a.ActivatedAt != nil:
		return a.ActivatedAt
	case a.RetiredAt != nil || a.State == string(castate.StateActive):
		return a.PreparedAt
	}
	return nil
}

// withIncomplete says on a's count why it may be short (SignedCount.
// Incomplete): a signed before since, when this replica began counting,
// and what it signed then may not have expired (within maxTTL of when it
// stopped signing, or of since; 0: unknown, it may not have); and shared,
// the reasons that hold for every authority (incompleteEverywhere).
func (h *Handler) withIncomplete(a api.CAAuthority, since *time.Time, maxTTL time.Duration, shared []string) api.CAAuthority {
	if a.Signed == nil {
		return a
	}
	var why []string
	if from := signedFrom(a); from != nil && since != nil && from.Before(*since) {
		stopped := *since
		if a.RetiredAt != nil && a.RetiredAt.Before(stopped) {
			stopped = *a.RetiredAt
		}
		if maxTTL == 0 || h.cfg.Clock.Now().Before(stopped.Add(maxTTL)) {
			why = append(why, fmt.Sprintf("it signed from %s, before this replica began counting at %s", stamp(*from), stamp(*since)))
		}
	}
	why = append(why, shared...)
	if len(why) > 0 {
		n := *a.Signed
		n.Incomplete = strings.Join(why, "; ")
		a.Signed = &n
	}
	return a
}

// incompleteEverywhere are the reasons every authority's count may be
// short, read once per listing: other replicas sign, the ledger dropped
// entries.
func (h *Handler) incompleteEverywhere() []string {
	var why []string
	if h.cfg.IsLeader != nil {
		why = append(why, "every replica signs and counts only its own")
	}
	if h.cfg.SignedIncomplete != nil {
		if s := h.cfg.SignedIncomplete(); s != "" {
			why = append(why, s)
		}
	}
	return why
}

// withSigned is a with its count from signed, zero when it has none,
// when the server counts.
func withSigned(a api.CAAuthority, signed map[string]api.SignedCount, counted bool) api.CAAuthority {
	if counted {
		n := signed[api.SignedKey(a)]
		n.Last = n.Last.UTC()
		a.Signed = &n
	}
	return a
}

// refreshHint is the published bundle's refresh hint, which paces a
// prepared authority's activation.
func (h *Handler) refreshHint() time.Duration {
	if b := h.cfg.CA.Bundle(); b != nil {
		hint, _ := b.RefreshHint()
		return hint
	}
	return 0
}

// authority is the CA's authority id (X.509, or JWT key with jwt) as
// listed now.
func (h *Handler) authority(jwt bool, id string) (api.CAAuthority, bool) {
	list := h.CAAuthorities()
	items := list.X509
	if jwt {
		items = list.JWT
	}
	i := slices.IndexFunc(items, func(a api.CAAuthority) bool { return a.ID == id })
	if i < 0 {
		return api.CAAuthority{}, false
	}
	return items[i], true
}

// serveAuthorityChange is POST /v1/ca/authorities: an operator's
// prepare, activate, taint or revoke, refused as the CA refuses it, and
// revoke also while workloads still present what the authority signed
// (unless forced). Each change is audited with who asked.
func (h *Handler) serveAuthorityChange(w http.ResponseWriter, r *http.Request, actor string) {
	req, ok := readAuthorityChange(w, r)
	if !ok {
		return
	}
	var before api.CAAuthority
	if req.ID != "" {
		before, _ = h.authority(req.JWT, req.ID)
	}
	if req.Action == actionRevoke && !req.Force {
		if msg := inUse(before); msg != "" {
			http.Error(w, msg, http.StatusConflict)
			return
		}
	}
	prepared := h.preparedID(req)
	id, err := h.cfg.Authorities.ChangeAuthority(ca.AuthorityChange{Action: req.Action, JWT: req.JWT, ID: req.ID, Now: req.Now})
	if err != nil {
		http.Error(w, err.Error(), authorityStatus(err))
		return
	}
	after, ok := h.authority(req.JWT, id)
	if !ok {
		// Changed, but gone from the list: a revoked authority that has
		// just expired.
		after = api.CAAuthority{ID: id, Kind: before.Kind, State: string(castate.StateRevoked)}
	}
	res := api.CAAuthorityResult{Authority: after, Message: changeMessage(req.Action, after, h.cfg.CA.Sequence())}
	if req.Action == actionPrepare && prepared != "" {
		res.Message = fmt.Sprintf("%s %s was already prepared and waits; nothing changed", kindLabel(after), id)
	} else {
		h.auditChange(req, before, after, actor)
	}
	if req.Action == actionActivate {
		res.NotSeen, res.Warnings = h.unseen(after)
	}
	writeJSON(w, res, true)
}

// readAuthorityChange reads the body strictly: one JSON object of known
// fields, within maxAuthorityBody; else it answers 400 (413 when too
// large).
func readAuthorityChange(w http.ResponseWriter, r *http.Request) (api.CAAuthorityChange, bool) {
	var req api.CAAuthorityChange
	body, ok := readBody(w, r, maxAuthorityBody)
	if !ok {
		return req, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(&req)
	if err == nil && dec.Decode(&struct{}{}) != io.EOF {
		err = errors.New("more than one JSON value")
	}
	if err == nil && !slices.Contains([]string{actionPrepare, actionActivate, actionTaint, actionRevoke}, req.Action) {
		err = fmt.Errorf("action %q: want prepare, activate, taint or revoke", req.Action)
	}
	if err != nil {
		http.Error(w, "authority change: "+err.Error(), http.StatusBadRequest)
		return req, false
	}
	return req, true
}

// preparedID is the ID of the authority already prepared when req is a
// prepare: the CA then changes nothing and answers with it.
func (h *Handler) preparedID(req api.CAAuthorityChange) string {
	if req.Action != actionPrepare {
		return ""
	}
	list := h.CAAuthorities()
	items := list.X509
	if req.JWT {
		items = list.JWT
	}
	for _, a := range items {
		if a.State == string(castate.StatePrepared) {
			return a.ID
		}
	}
	return ""
}

// inUse says why a is not to be revoked yet: workloads still present what
// it signed. "" when none does, or when the server does not count.
func inUse(a api.CAAuthority) string {
	if a.Signed == nil {
		return ""
	}
	if a.Signed.InUse == 0 && a.Signed.Incomplete != "" {
		return fmt.Sprintf("%s %s: this server cannot tell whether workloads still present what it signed (%s); "+
			"check them (Istio's own clients re-issue only at their next renewal), then revoke it with --force",
			kindLabel(a), a.ID, a.Signed.Incomplete)
	}
	if a.Signed.InUse == 0 {
		return ""
	}
	return fmt.Sprintf("%s %s: %d workloads still present what it signed (the last of it expires at %s); "+
		"wait until `trustbridge ca authority list` shows none in use (they re-issue because it is tainted), "+
		"or revoke it anyway with --force: they then fail until they re-issue",
		kindLabel(a), a.ID, a.Signed.InUse, stamp(a.Signed.Last))
}

// authorityStatus maps the CA's refusals to HTTP.
func authorityStatus(err error) int {
	switch {
	case errors.Is(err, castate.ErrAuthorityNotFound):
		return http.StatusNotFound
	case errors.Is(err, castate.ErrAuthorityState), errors.Is(err, castate.ErrNotLeader):
		return http.StatusConflict
	default:
		return http.StatusInternalServerError
	}
}

// changeMessage says, on one line, what action did to a and what
// follows for clients and peers.
func changeMessage(action string, a api.CAAuthority, seq uint64) string {
	what := kindLabel(a) + " " + a.ID
	switch action {
	case actionPrepare:
		if a.State == string(castate.StateActive) {
			// Upstream mode: the upstream signed a new intermediate under
			// roots already published, so it signs at once.
			return fmt.Sprintf("prepared %s: signed by upstream %s, it signs every new certificate from now; the one it replaces retired", what, a.Upstream)
		}
		when := fmt.Sprintf("%d refresh hints after it is published", ca.PublishLead)
		if a.ActivatesAt != nil {
			when = "from " + stamp(*a.ActivatesAt)
		}
		return fmt.Sprintf("prepared %s: peers fetch it with the bundle; it signs %s, or at once with `ca authority activate --now`", what, when)
	case actionActivate:
		return fmt.Sprintf("activated %s: it signs every new certificate from now; the one it replaces retired and stays published", what)
	case actionTaint:
		return fmt.Sprintf("tainted %s: it signs nothing more and clients re-issue what it signed (Istio's at their next renewal); revoke it once `ca authority list` shows none of it in use", what)
	default:
		return fmt.Sprintf("revoked %s: it left the bundle (sequence %d); peers refuse what it signed once they fetch it", what, seq)
	}
}

// unseen are the clients of our bundle endpoint whose last fetch
// predates a's publication, and a warning for each: they refuse what a
// signs until their next fetch.
func (h *Handler) unseen(a api.CAAuthority) ([]api.BundleFetcher, []string) {
	what := kindLabel(a) + " " + a.ID
	var published time.Time
	if a.PublishedAt != nil {
		published = *a.PublishedAt
	}
	if h.cfg.Fetchers == nil {
		return nil, []string{fmt.Sprintf("fetches of our bundle are not tracked here: a peer that has not fetched it since %s refuses what %s signs until it does", stamp(published), what)}
	}
	var out []api.BundleFetcher
	var warnings []string
	if h.cfg.Signed != nil {
		// The record starts empty with the process (Signed's since).
		if _, started := h.cfg.Signed(); started.After(published) {
			warnings = append(warnings, fmt.Sprintf("this replica started at %s, after %s was published at %s: clients that fetched our bundle only before then are not known here",
				stamp(started), what, stamp(published)))
		}
	}
	if h.cfg.IsLeader != nil {
		warnings = append(warnings, "each replica records only the clients it served: peers served by another replica are not known here")
	}
	for _, f := range h.cfg.Fetchers() {
		if f.LastFetch.Before(published) {
			out = append(out, f)
		}
	}
	slices.SortFunc(out, func(a, b api.BundleFetcher) int { return cmp.Compare(a.Client, b.Client) })
	for _, f := range out {
		warnings = append(warnings, fmt.Sprintf("%s last fetched our bundle at %s (sequence %d), before %s was published at %s: it refuses what %s signs until its next fetch",
			f.Client, stamp(f.LastFetch), f.Sequence, what, stamp(published), what))
	}
	return out, warnings
}

// auditChange records an operator's change with who asked: the request,
// where the audit trail's own root_* and jwt_key_* entries record the
// state it led to.
func (h *Handler) auditChange(req api.CAAuthorityChange, before, after api.CAAuthority, actor string) {
	if h.cfg.Audit == nil {
		return
	}
	seq := h.cfg.CA.Sequence()
	fp := fingerprint(after)
	e := audit.Entry{Event: "ca_authority_" + pastTense(req.Action), TrustDomain: h.cfg.TrustDomain.Name(), NewSequence: &seq,
		Reason: fmt.Sprintf("%s %s by %s (admin API)", kindLabel(after), after.ID, actor)}
	switch req.Action {
	case actionPrepare:
		e.Added = []string{fp}
	case actionRevoke:
		e.Removed = []string{fp}
		if req.Force && before.Signed != nil && before.Signed.InUse > 0 {
			e.Reason += fmt.Sprintf(": revoked with --force while %d workloads still presented what it signed", before.Signed.InUse)
		}
	default:
		e.Reason += " [" + fp + "]"
		if req.Now {
			e.Reason += ": activated early with --now"
		}
	}
	h.cfg.Audit(e)
}

// fingerprint names a as the audit log names authorities.
func fingerprint(a api.CAAuthority) string {
	if a.Kind == api.CAKindJWT {
		return "jwt:" + a.ID + ":" + a.SHA256
	}
	return "x509:" + a.SHA256
}

// pastTense names action's audit event: ca_authority_<pastTense>.
func pastTense(action string) string {
	switch action {
	case actionPrepare:
		return "prepared"
	case actionActivate:
		return "activated"
	case actionTaint:
		return "tainted"
	}
	return "revoked"
}

// kindLabel names a's kind in messages.
func kindLabel(a api.CAAuthority) string {
	switch a.Kind {
	case api.CAKindJWT:
		return "JWT key"
	case "":
		return "authority"
	}
	return a.Kind
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
