package api

import (
	"time"

	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
)

// IdentityMap is the identity map in force: the rules node agents map
// attested workloads to SPIFFE IDs with, which the server checks their
// requests against (/v1/snapshot's identity_map).
type IdentityMap struct {
	// Sources are the map's sources ("file:<path>", "crd") and what each
	// last did.
	Sources []PolicySource `json:"sources"`
	// Default is "istio" or "none": what a pod no rule selects gets.
	Default string         `json:"default"`
	Rules   []IdentityRule `json:"rules"`
	// Conflicts are pairs of rules that may select one workload with
	// different SPIFFE IDs (such a workload gets none), each a sentence
	// naming the rules.
	Conflicts []string `json:"conflicts"`
	// AgentOnly are the rules only a node agent can evaluate, each a
	// sentence: the server never grants their IDs.
	AgentOnly []string `json:"agent_only"`
}

// IdentityRule is one rule of the map.
type IdentityRule struct {
	Name   string `json:"name"`
	Origin string `json:"origin"`
	// SPIFFEID and DNSNames are the rule's templates; TTL is a Go
	// duration, "" for the issuer's.
	SPIFFEID string   `json:"spiffe_id"`
	TTL      string   `json:"ttl,omitempty"`
	DNSNames []string `json:"dns_names"`
	// ServerChecks is false when only a node agent can evaluate the rule.
	ServerChecks bool `json:"server_checks"`
}

// NewIdentityMap is the wire view of m (nil: none loaded yet) and its
// sources.
func NewIdentityMap(sources []identitymap.Status, m *identitymap.Map) *IdentityMap {
	v := &IdentityMap{Sources: policySources(sources), Default: string(identitymap.DefaultIstio), Rules: []IdentityRule{}, Conflicts: []string{}, AgentOnly: []string{}}
	if m == nil {
		return v
	}
	v.Default = string(m.Default())
	agentOnly := map[string]bool{}
	for _, a := range m.AgentOnly() {
		agentOnly[a.Name] = true
		v.AgentOnly = append(v.AgentOnly, a.Message)
	}
	for _, r := range m.Rules() {
		ir := IdentityRule{Name: r.Name, Origin: r.Origin, SPIFFEID: r.SPIFFEID, DNSNames: append([]string{}, r.DNSNames...), ServerChecks: !agentOnly[r.Name]}
		if r.TTL > 0 {
			ir.TTL = r.TTL.String()
		}
		v.Rules = append(v.Rules, ir)
	}
	for _, c := range m.Conflicts() {
		v.Conflicts = append(v.Conflicts, c.Message)
	}
	return v
}

// policySources are the wire view of rule sources' statuses (the trust
// policy's and the identity map's are the same type).
func policySources(sources []identitymap.Status) []PolicySource {
	out := []PolicySource{}
	for _, st := range sources {
		src := PolicySource{Source: st.Source, Rules: st.Rules, LastError: st.LastError}
		if st.LastSuccess > 0 {
			t := time.Unix(st.LastSuccess, 0).UTC()
			src.LastSuccess = &t
		}
		out = append(out, src)
	}
	return out
}

// IdentityExplanation is which identity one described workload would get
// from the identity map and why: GET /v1/identity/explain and
// `trustbridge identity explain`.
type IdentityExplanation struct {
	Workload IdentityWorkload `json:"workload"`
	Default  string           `json:"default"`
	// Rules is how many rules were considered.
	Rules   int             `json:"rules"`
	Matched []IdentityMatch `json:"matched"`
	// SPIFFEID, TTL and DNSNames are the identity; SPIFFEID is "" when
	// there is none, and Error says why.
	SPIFFEID string   `json:"spiffe_id,omitempty"`
	TTL      string   `json:"ttl,omitempty"`
	DNSNames []string `json:"dns_names"`
	Because  string   `json:"because"`
	Error    string   `json:"error,omitempty"`
	// Conflicts and AgentOnly are those of the map's that name a matched
	// rule.
	Conflicts []string `json:"conflicts"`
	AgentOnly []string `json:"agent_only"`
	// Note, when set, says what the explanation could not know (the
	// server has no unix facts).
	Note string `json:"note,omitempty"`
}

// IdentityWorkload is the workload explained: its attested facts
// (identitymap.Workload).
type IdentityWorkload struct {
	Kubernetes     bool              `json:"kubernetes"`
	Namespace      string            `json:"namespace,omitempty"`
	ServiceAccount string            `json:"service_account,omitempty"`
	PodName        string            `json:"pod_name,omitempty"`
	PodUID         string            `json:"pod_uid,omitempty"`
	PodLabels      map[string]string `json:"pod_labels,omitempty"`
	NodeName       string            `json:"node_name,omitempty"`
	ContainerName  string            `json:"container_name,omitempty"`
	// Unix says UID and GID were attested.
	Unix       bool   `json:"unix"`
	UID        uint32 `json:"uid"`
	GID        uint32 `json:"gid"`
	User       string `json:"user,omitempty"`
	Group      string `json:"group,omitempty"`
	BinaryPath string `json:"binary_path,omitempty"`
}

func newIdentityWorkload(w identitymap.Workload) IdentityWorkload {
	return IdentityWorkload{Kubernetes: w.Kubernetes, Namespace: w.Namespace, ServiceAccount: w.ServiceAccount, PodName: w.PodName,
		PodUID: w.PodUID, PodLabels: w.PodLabels, NodeName: w.NodeName, ContainerName: w.ContainerName,
		Unix: w.Unix, UID: w.UID, GID: w.GID, User: w.User, Group: w.Group, BinaryPath: w.BinaryPath}
}

// IdentityMatch is one rule that selects the workload.
type IdentityMatch struct {
	Rule     string   `json:"rule"`
	Origin   string   `json:"origin"`
	Selector int      `json:"selector"`
	Fields   []string `json:"fields"`
	SPIFFEID string   `json:"spiffe_id,omitempty"`
	DNSNames []string `json:"dns_names"`
	Error    string   `json:"error,omitempty"`
}

// ExplainIdentity explains m.Identify(w) (m nil: none loaded).
func ExplainIdentity(m *identitymap.Map, w identitymap.Workload) IdentityExplanation {
	e := m.Explain(w)
	out := IdentityExplanation{Workload: newIdentityWorkload(e.Workload), Default: string(e.Default), Rules: e.Rules, Matched: []IdentityMatch{},
		SPIFFEID: e.SPIFFEID, TTL: e.TTL, DNSNames: append([]string{}, e.DNSNames...), Because: e.Because, Error: e.Error,
		Conflicts: []string{}, AgentOnly: []string{}}
	matched := map[string]bool{}
	for _, mr := range e.Matched {
		matched[mr.Rule] = true
		out.Matched = append(out.Matched, IdentityMatch{Rule: mr.Rule, Origin: mr.Origin, Selector: mr.Selector, Fields: mr.Fields,
			SPIFFEID: mr.SPIFFEID, DNSNames: append([]string{}, mr.DNSNames...), Error: mr.Error})
	}
	for _, c := range m.Conflicts() {
		if matched[c.First.Name] || matched[c.Second.Name] {
			out.Conflicts = append(out.Conflicts, c.Message)
		}
	}
	for _, a := range m.AgentOnly() {
		if matched[a.Name] {
			out.AgentOnly = append(out.AgentOnly, a.Message)
		}
	}
	return out
}
