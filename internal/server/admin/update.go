package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/federation/managed"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// serveUpdate changes a run-time relationship by a patch (federation
// update): only the fields given change. ?no_fetch skips the fetch the
// updated endpoint must pass, as with add.
func (h *Handler) serveUpdate(w http.ResponseWriter, r *http.Request, actor string) {
	td, ok := pathTrustDomain(w, r)
	if !ok {
		return
	}
	patch, ok := readPatch(w, r)
	if !ok {
		return
	}
	var (
		updated  federation.Endpoint
		warnings []string
	)
	edit := func(old federation.Endpoint) (federation.Endpoint, error) {
		ep, warns, err := patchEndpoint(old, patch)
		updated, warnings = ep, warns
		return ep, err
	}
	opts := managed.AddOptions{NoProbe: r.URL.Query().Has("no_fetch"), Actor: actor}
	if err := h.cfg.Manager.Update(r.Context(), td, edit, opts); err != nil {
		http.Error(w, err.Error(), statusOf(err))
		return
	}
	_, _ = fmt.Fprintf(w, "updated %s: federated by %s\n", td.Name(), updated)
	for _, warn := range warnings {
		_, _ = fmt.Fprintf(w, "warning: %s\n", warn)
	}
}

// readPatch reads the body strictly: one JSON object of known fields
// that changes something; else it answers 400 (413 when too large).
func readPatch(w http.ResponseWriter, r *http.Request) (api.RelationshipPatch, bool) {
	var p api.RelationshipPatch
	body, ok := readBody(w, r, maxMutationBody)
	if !ok {
		return p, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(&p)
	if err == nil && dec.Decode(&struct{}{}) != io.EOF {
		err = errors.New("more than one JSON value")
	}
	if err == nil && p == (api.RelationshipPatch{}) {
		err = errors.New("it changes nothing: give at least one of endpoint_url, profile, endpoint_spiffe_id, trust_domain_bundle")
	}
	if err != nil {
		http.Error(w, "relationship update: "+err.Error(), http.StatusBadRequest)
		return p, false
	}
	return p, true
}

// patchEndpoint is old with p's fields changed, parsed again by the
// --federation-config parser (federation.ParseConfig) so that an updated
// endpoint obeys every rule an added one does. Refresh bounds and, unless
// p gives one, the bootstrap bundle are kept. Switching to https_web drops
// the endpoint SPIFFE ID; switching to https_spiffe needs one, given or
// kept.
func patchEndpoint(old federation.Endpoint, p api.RelationshipPatch) (federation.Endpoint, []string, error) {
	e, err := federation.EntryOf(old)
	if err != nil {
		return old, nil, err
	}
	if p.EndpointURL != nil {
		e.BundleEndpointURL = *p.EndpointURL
	}
	if e.BundleEndpointProfile, err = patchProfile(e.BundleEndpointProfile, p); err != nil {
		return old, nil, err
	}
	if p.TrustDomainBundle != nil {
		e.TrustDomainBundle = *p.TrustDomainBundle
	}
	doc, err := json.Marshal(map[string]any{"federation": []federation.ConfigEntry{e}})
	if err != nil {
		return old, nil, err
	}
	cfg, err := federation.ParseConfig(doc, nil)
	if err != nil {
		return old, nil, patchError(err, e.TrustDomain)
	}
	if len(cfg.Endpoints) != 1 {
		return old, nil, fmt.Errorf("the update makes %d endpoints, want 1", len(cfg.Endpoints))
	}
	return cfg.Endpoints[0], cfg.Warnings, nil
}

// patchError is a ParseConfig error about the one entry a patch makes,
// told in the patch's terms: the line and index of a document the caller
// never wrote, and the configuration's key names, mean nothing to them.
func patchError(err error, td string) error {
	rest, ok := strings.CutPrefix(err.Error(), fmt.Sprintf("federation: line 1: federation[0] (%s): ", td))
	if !ok {
		return err
	}
	keys := strings.NewReplacer("bundleEndpointURL", "endpoint_url", "endpointSPIFFEID", "endpoint_spiffe_id",
		"trustDomainBundle", "trust_domain_bundle", "bundledoc: ", "")
	return errors.New(keys.Replace(rest))
}

func patchProfile(cur federation.ConfigProfile, p api.RelationshipPatch) (federation.ConfigProfile, error) {
	if p.Profile != nil {
		switch federation.Profile(*p.Profile) {
		case federation.ProfileHTTPSWeb:
			if p.EndpointSPIFFEID != nil {
				return cur, errors.New("profile https_web authenticates the endpoint by Web PKI, without an endpoint SPIFFE ID: give one or the other")
			}
			return federation.ConfigProfile{Type: string(federation.ProfileHTTPSWeb)}, nil
		case federation.ProfileHTTPSSPIFFE:
			cur.Type = *p.Profile
		default:
			return cur, fmt.Errorf("profile %q: want https_web or https_spiffe", *p.Profile)
		}
	}
	if p.EndpointSPIFFEID != nil {
		cur = federation.ConfigProfile{Type: string(federation.ProfileHTTPSSPIFFE), EndpointSPIFFEID: *p.EndpointSPIFFEID}
	}
	if cur.Type == string(federation.ProfileHTTPSSPIFFE) && cur.EndpointSPIFFEID == "" {
		return cur, errors.New("profile https_spiffe needs the endpoint's SPIFFE ID: give endpoint_spiffe_id (--endpoint-spiffe-id)")
	}
	return cur, nil
}
