package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
)

// Minter signs SVIDs for the identities an operator names (ca.Authority,
// which the server wraps to count them in its issuance ledger).
type Minter interface {
	SignX509SVID(p ca.X509SVIDParams) (*ca.Issued, error)
	SignJWT(id spiffeid.ID, audience []string, ttl time.Duration) (string, time.Time, error)
}

// maxMintBody bounds POST /v1/svid/*: a CSR of an RSA-4096 key is under
// 2 KiB in PEM; 16 audiences of 512 bytes fit too.
const maxMintBody = 16 << 10

// Audit events of an operator's mint.
const (
	eventX509Minted = "x509_svid_minted"
	eventJWTMinted  = "jwt_svid_minted"
)

func (h *Handler) mintRoutes() {
	if h.cfg.Mint == nil {
		return
	}
	h.mux.HandleFunc("POST /v1/svid/x509", h.mutation(h.serveMintX509))
	h.mux.HandleFunc("POST /v1/svid/jwt", h.mutation(h.serveMintJWT))
}

// serveMintX509 signs the CSR's key for the SPIFFE ID the operator
// names: the key never reaches the server.
func (h *Handler) serveMintX509(w http.ResponseWriter, r *http.Request, actor string) {
	var req api.X509SVIDMint
	if !decodeStrict(w, r, "x509-svid mint", &req) {
		return
	}
	id, ok := h.mintID(w, req.SPIFFEID)
	if !ok {
		return
	}
	csr, err := ca.ParseCSR([]byte(req.CSR))
	if err != nil {
		http.Error(w, "csr: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := h.mintDNSNames(req.DNSNames); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ttl, warnings, ok := h.mintTTL(w, req.TTLSeconds, h.cfg.MaxWorkloadTTL, "--max-workload-ttl")
	if !ok {
		return
	}
	issued, err := h.cfg.Mint.SignX509SVID(ca.X509SVIDParams{PublicKey: csr.PublicKey, SPIFFEID: id, TTL: ttl, DNSNames: req.DNSNames})
	if err != nil {
		http.Error(w, err.Error(), mintStatus(err))
		return
	}
	leaf := issued.Leaf
	if ttl > 0 && leaf.NotAfter.Before(h.cfg.Clock.Now().Add(ttl-time.Minute)) {
		warnings = append(warnings, fmt.Sprintf("it expires at %s, sooner than asked: the CA's signing certificate expires first", stamp(leaf.NotAfter)))
	}
	res := api.X509SVIDMinted{SPIFFEID: id.String(), Serial: leaf.SerialNumber.Text(16), ExpiresAt: leaf.NotAfter.UTC(),
		CertChain: string(caclient.EncodeCerts(issued.Chain[:len(issued.Chain)-len(issued.Roots)])),
		Bundle:    string(caclient.EncodeCerts(issued.Roots)), Warnings: warnings}
	reason := fmt.Sprintf("X509-SVID %s (serial %s, expires %s", id, res.Serial, stamp(leaf.NotAfter))
	if len(leaf.DNSNames) > 0 {
		reason += ", DNS " + strings.Join(leaf.DNSNames, " ")
	}
	h.auditMint(eventX509Minted, reason+") minted by "+actor+" (admin API)")
	writeJSON(w, res, true)
}

// serveMintJWT mints a JWT-SVID for the SPIFFE ID the operator names.
func (h *Handler) serveMintJWT(w http.ResponseWriter, r *http.Request, actor string) {
	var req api.JWTSVIDMint
	if !decodeStrict(w, r, "jwt-svid mint", &req) {
		return
	}
	id, ok := h.mintID(w, req.SPIFFEID)
	if !ok {
		return
	}
	if err := certservice.CheckAudiences(req.Audience); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// The CA clamps to its own maximum, which only it knows.
	ttl, warnings, ok := h.mintTTL(w, req.TTLSeconds, 0, "")
	if !ok {
		return
	}
	token, exp, err := h.cfg.Mint.SignJWT(id, req.Audience, ttl)
	if err != nil {
		http.Error(w, err.Error(), mintStatus(err))
		return
	}
	if ttl > 0 && exp.Before(h.cfg.Clock.Now().Add(ttl-time.Minute)) {
		warnings = append(warnings, fmt.Sprintf("it expires at %s, sooner than asked: the server's JWT-SVID maximum (--max-jwt-svid-ttl) or its signing key's end applies", stamp(exp)))
	}
	h.auditMint(eventJWTMinted, fmt.Sprintf("JWT-SVID %s for audience %s (key %s, expires %s) minted by %s (admin API)",
		id, strings.Join(req.Audience, " "), jwtsvid.KeyID(token), stamp(exp), actor))
	writeJSON(w, api.JWTSVIDMinted{SPIFFEID: id.String(), ExpiresAt: exp.UTC(), Token: token, Warnings: warnings}, true)
}

// mintID is raw as an identity this server signs for: of its trust
// domain, with a path; else it answers 400 saying why.
func (h *Handler) mintID(w http.ResponseWriter, raw string) (spiffeid.ID, bool) {
	id, err := spiffeid.FromString(raw)
	switch {
	case err != nil:
		err = fmt.Errorf("spiffe_id %q: %w", raw, err)
	case !id.MemberOf(h.cfg.TrustDomain):
		err = fmt.Errorf("spiffe_id %s is of trust domain %s: this server signs for %s only", id, id.TrustDomain().Name(), h.cfg.TrustDomain.Name())
	case id.Path() == "":
		err = fmt.Errorf("spiffe_id %s names the trust domain itself: an SVID's ID has a path (spiffe://%s/PATH)", id, h.cfg.TrustDomain.Name())
	case slices.Contains(h.cfg.Reserved, id) || underPath(id.Path(), h.cfg.ReservedPath):
		err = fmt.Errorf("spiffe_id %s is this server's own identity (the server keeps %s for itself): a minted SVID of it would let its holder pose as the server to peers and agents; mint another ID", id, h.reservedText())
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return id, false
	}
	return id, true
}

// underPath says whether path is prefix or under it ("" reserves nothing).
func underPath(path, prefix string) bool {
	prefix = strings.TrimSuffix(prefix, "/")
	return prefix != "" && (path == prefix || strings.HasPrefix(path, prefix+"/"))
}

// reservedText names the server's own identities for an error.
func (h *Handler) reservedText() string {
	var names []string
	if p := strings.TrimSuffix(h.cfg.ReservedPath, "/"); p != "" {
		names = append(names, "spiffe://"+h.cfg.TrustDomain.Name()+p+"/*")
	}
	for _, id := range h.cfg.Reserved {
		if !underPath(id.Path(), h.cfg.ReservedPath) {
			names = append(names, id.String())
		}
	}
	return strings.Join(names, " and ")
}

// mintDNSNames refuses DNS names the server serves under, equal to one or
// matched by a wildcard either way: an SVID naming one would pose as the
// server to clients that check host names.
func (h *Handler) mintDNSNames(asked []string) error {
	for _, name := range asked {
		for _, own := range h.cfg.ReservedDNSNames {
			if hostMatches(name, own) || hostMatches(own, name) {
				return fmt.Errorf("dns_names %q: %s is a host name this server serves under (its certificate service, bundle endpoint or admin listener); an SVID naming it would let its holder pose as the server; mint another name", name, own)
			}
		}
	}
	return nil
}

// hostMatches says whether pattern (a name or a *.-wildcard) covers name,
// as a TLS client checks it: case-insensitive, ignoring a final dot, the
// wildcard standing for exactly one label.
func hostMatches(pattern, name string) bool {
	pattern = strings.ToLower(strings.TrimSuffix(pattern, "."))
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if pattern == "" || name == "" {
		return false
	}
	if pattern == name {
		return true
	}
	rest, ok := strings.CutPrefix(pattern, "*.")
	if !ok {
		return false
	}
	_, parent, found := strings.Cut(name, ".")
	return found && parent == rest
}

// mintTTL is the lifetime asked for, clamped to max when max is set
// (named by flag in the warning); 0 asks for the server's default.
func (h *Handler) mintTTL(w http.ResponseWriter, seconds int64, max time.Duration, flag string) (time.Duration, []string, bool) {
	if seconds < 0 || seconds > int64(365*24*time.Hour/time.Second) {
		http.Error(w, fmt.Sprintf("ttl_seconds %d: want 0 (the server's default) up to a year", seconds), http.StatusBadRequest)
		return 0, nil, false
	}
	ttl := time.Duration(seconds) * time.Second
	if max > 0 && ttl > max {
		return max, []string{fmt.Sprintf("lifetime %s clamped to the server's maximum %s (%s)", ttl, max, flag)}, true
	}
	return ttl, nil, true
}

// auditMint records a mint with who asked: an SVID of any identity is
// the one thing the admin API hands out that acts as a workload.
func (h *Handler) auditMint(event, reason string) {
	if h.cfg.Audit != nil {
		h.cfg.Audit(audit.Entry{Event: event, TrustDomain: h.cfg.TrustDomain.Name(), Reason: reason})
	}
}

// mintStatus maps the CA's refusals to HTTP: the request's fault is 400,
// a CA that cannot sign now 503.
func mintStatus(err error) int {
	switch {
	case errors.Is(err, ca.ErrInvalidCSR), errors.Is(err, ca.ErrIdentityNotAllowed), errors.Is(err, ca.ErrInvalidTTL),
		errors.Is(err, jwtsvid.ErrInvalidClaims):
		return http.StatusBadRequest
	case errors.Is(err, ca.ErrInvalidSigningMaterial), errors.Is(err, jwtsvid.ErrInvalidKey):
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// decodeStrict reads the body into v strictly: one JSON object of known
// fields within maxMintBody; else it answers 400 (413 when too large)
// naming what.
func decodeStrict(w http.ResponseWriter, r *http.Request, what string, v any) bool {
	body, ok := readBody(w, r, maxMintBody)
	if !ok {
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.Decode(&struct{}{}) != io.EOF {
		err = errors.New("more than one JSON value")
	}
	if err != nil {
		http.Error(w, what+": "+err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}
