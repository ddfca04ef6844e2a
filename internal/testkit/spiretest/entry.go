package spiretest

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// Entry is a registration entry, as `spire-server entry create` takes it.
type Entry struct {
	// ParentID is the agent (or node entry) the entry is issued under.
	ParentID string
	SPIFFEID string
	// Selectors are "type:value" pairs, e.g. "unix:uid:0".
	Selectors []string
	// FederatesWith are trust domain names whose bundles the workload gets
	// beside its own; SPIRE must hold a bundle for each (SetBundle).
	FederatesWith []string
	// Admin grants the entry's SPIFFE ID SPIRE's admin APIs (-admin),
	// MintX509SVID and MintJWTSVID among them.
	Admin bool
}

// TrustDomain is the server's trust domain.
func (s *Server) TrustDomain() string { return s.trustDomain }

// CreateEntry registers e and returns its entry ID.
func (s *Server) CreateEntry(t testing.TB, e Entry) string {
	t.Helper()
	args := []string{"entry", "create", "-parentID", e.ParentID, "-spiffeID", e.SPIFFEID, "-output", "json"}
	for _, sel := range e.Selectors {
		args = append(args, "-selector", sel)
	}
	for _, td := range e.FederatesWith {
		args = append(args, "-federatesWith", "spiffe://"+td)
	}
	if e.Admin {
		args = append(args, "-admin")
	}
	out, err := s.cli(nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	id, err := parseEntryCreate(out)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// parseEntryCreate reads the batch result of entry create -output json:
// the CLI exits 0 even when the one result carries an error status.
func parseEntryCreate(out string) (string, error) {
	var raw struct {
		Results []struct {
			Status struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"status"`
			Entry struct {
				ID string `json:"id"`
			} `json:"entry"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		return "", fmt.Errorf("entry create output: %w: %s", err, out)
	}
	if len(raw.Results) != 1 {
		return "", fmt.Errorf("entry create: %d results, want 1: %s", len(raw.Results), out)
	}
	r := raw.Results[0]
	if r.Status.Code != 0 || r.Entry.ID == "" {
		return "", fmt.Errorf("entry create: status %d %q", r.Status.Code, r.Status.Message)
	}
	return r.Entry.ID, nil
}

// JoinToken has the server mint a join token valid for ten minutes, for
// a client that attests as an agent itself (AttestAgent over Addr), and
// returns it with the agent's SPIFFE ID.
func (s *Server) JoinToken(t testing.TB) (token, agentID string) {
	t.Helper()
	token, agentID, err := s.joinToken()
	if err != nil {
		t.Fatal(err)
	}
	return token, agentID
}

// joinToken has the server mint a join token valid for ten minutes, and
// returns it with the SPIFFE ID an agent attesting with it gets.
func (s *Server) joinToken() (token, agentID string, err error) {
	out, err := s.cli(nil, "token", "generate", "-ttl", "600", "-output", "json")
	if err != nil {
		return "", "", err
	}
	var raw struct {
		Value string `json:"value"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil || raw.Value == "" {
		return "", "", fmt.Errorf("token generate output: %v: %s", err, out)
	}
	return raw.Value, "spiffe://" + s.trustDomain + "/spire/agent/join_token/" + raw.Value, nil
}

// LocalBundle is the server's own X.509 bundle (bundle show).
func (s *Server) LocalBundle() (*Bundle, error) {
	out, err := s.cli(nil, "bundle", "show", "-output", "json")
	if err != nil {
		return nil, err
	}
	return parseBundle(out)
}

// LocalBundleDoc is the server's own bundle as a SPIFFE bundle document
// (bundle show -format spiffe): X.509 and JWT authorities.
func (s *Server) LocalBundleDoc() ([]byte, error) {
	out, err := s.cli(nil, "bundle", "show", "-format", "spiffe")
	if err != nil {
		return nil, err
	}
	return []byte(out), nil
}

// localBundlePEM is the server's roots for an agent's trust_bundle_path.
func (s *Server) localBundlePEM() ([]byte, error) {
	b, err := s.LocalBundle()
	if err != nil {
		return nil, err
	}
	var out []byte
	for _, der := range b.X509Authorities {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("bundle show: no X.509 authority")
	}
	return out, nil
}

// UIDSelector is SPIRE's unix workload attestor's selector for uid.
func UIDSelector(uid int) string { return "unix:uid:" + strconv.Itoa(uid) }

// resourceNameOf is the SDS resource name SPIRE serves a trust domain's
// bundle under when asked for everything: its SPIFFE ID.
func resourceNameOf(td string) string {
	return "spiffe://" + strings.TrimPrefix(td, "spiffe://")
}
