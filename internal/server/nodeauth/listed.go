package nodeauth

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// Listed authorizes node agents outside Kubernetes (VMs, bare metal),
// which no pod informer can vouch for: each may act for exactly the
// identities an operator listed for it (`--ca-node-agent`), exact SPIFFE
// IDs or prefixes ("spiffe://td/vm/web-1/*"), of this trust domain. A
// listed agent is decided here alone, never by another authorizer.
type Listed struct {
	td     spiffeid.TrustDomain
	agents map[spiffeid.ID][]trustpolicy.Pattern
}

// MaxListedIdentities bounds the identities listed for one agent.
const MaxListedIdentities = 1024

// ParseListed reads `--ca-node-agent` values, each
// "AGENT_ID=ID[,ID...]": the SPIFFE ID the agent authenticates as and the
// identities it may act for, all of trust domain td. An agent listed
// twice, an identity outside td or without a path, an agent listed among
// its own identities, or identities covering one of reserved (the
// server's own IDs) or another listed agent are refused, naming the
// value.
func ParseListed(td spiffeid.TrustDomain, values []string, reserved ...spiffeid.ID) (*Listed, error) {
	l := &Listed{td: td, agents: make(map[spiffeid.ID][]trustpolicy.Pattern)}
	for _, v := range values {
		agent, ids, err := parseListedValue(td, v)
		if err == nil {
			err = coversNone(ids, reserved, "the server's own identity")
		}
		if err != nil {
			return nil, fmt.Errorf("%q: %w", v, err)
		}
		if _, dup := l.agents[agent]; dup {
			return nil, fmt.Errorf("%q: node agent %s is listed twice; give all its identities in one value", v, agent)
		}
		l.agents[agent] = ids
	}
	agents := make([]spiffeid.ID, 0, len(l.agents))
	for a := range l.agents {
		agents = append(agents, a)
	}
	for a, ids := range l.agents {
		if err := coversNone(ids, agents, "another node agent"); err != nil {
			return nil, fmt.Errorf("node agent %s: %w", a, err)
		}
	}
	return l, nil
}

// coversNone refuses identities matching any of ids, naming what they are.
func coversNone(patterns []trustpolicy.Pattern, ids []spiffeid.ID, what string) error {
	for _, p := range patterns {
		for _, id := range ids {
			if p.Matches(id) {
				return fmt.Errorf("identity %q covers %s (%s): a node agent may act only for workloads", p.String(), what, id)
			}
		}
	}
	return nil
}

func parseListedValue(td spiffeid.TrustDomain, v string) (spiffeid.ID, []trustpolicy.Pattern, error) {
	a, list, ok := strings.Cut(v, "=")
	if !ok || strings.TrimSpace(list) == "" {
		return spiffeid.ID{}, nil, errors.New(`want "AGENT_SPIFFE_ID=ID[,ID...]", e.g. spiffe://example.org/vm/web-1=spiffe://example.org/vm/web-1/app,spiffe://example.org/vm/web-1/jobs/*`)
	}
	agent, err := spiffeid.FromString(strings.TrimSpace(a))
	if err != nil || !agent.MemberOf(td) || agent.Path() == "" {
		return spiffeid.ID{}, nil, fmt.Errorf("node agent %q is not a SPIFFE ID of a workload of %s", a, td.Name())
	}
	items := strings.Split(list, ",")
	if len(items) > MaxListedIdentities {
		return spiffeid.ID{}, nil, fmt.Errorf("%d identities; at most %d per node agent", len(items), MaxListedIdentities)
	}
	var ids []trustpolicy.Pattern
	for _, item := range items {
		p, err := trustpolicy.ParsePattern(strings.TrimSpace(item))
		if err != nil {
			return spiffeid.ID{}, nil, fmt.Errorf("identity %q: %w", item, err)
		}
		if p.TrustDomain() != td {
			return spiffeid.ID{}, nil, fmt.Errorf("identity %q is not of %s: a node agent acts only for workloads of this trust domain", item, td.Name())
		}
		if p.Matches(agent) {
			return spiffeid.ID{}, nil, fmt.Errorf("identity %q covers the node agent's own ID; list its workloads only", item)
		}
		ids = append(ids, p)
	}
	return agent, ids, nil
}

// Lists reports whether id is a listed node agent.
func (l *Listed) Lists(id spiffeid.ID) bool {
	_, ok := l.agents[id]
	return ok
}

// Agents are the listed node agents' IDs, sorted.
func (l *Listed) Agents() []string {
	out := make([]string, 0, len(l.agents))
	for id := range l.agents {
		out = append(out, id.String())
	}
	slices.Sort(out)
	return out
}

// AuthorizeImpersonation grants caller, a listed node agent, target when
// one of its identities covers it.
func (l *Listed) AuthorizeImpersonation(_ context.Context, caller authn.Identity, target spiffeid.ID) error {
	ids, ok := l.agents[caller.ID]
	if !ok {
		return fmt.Errorf("%s is not a node agent listed with --ca-node-agent", caller.ID)
	}
	for _, p := range ids {
		if p.Matches(target) {
			return nil
		}
	}
	return fmt.Errorf("%s is not among the identities listed for node agent %s (--ca-node-agent)", target, caller.ID)
}

// AuthorizeImpersonationNames refuses every DNS name: the identities
// listed for an agent are bare SPIFFE IDs, and nothing the server knows
// of a VM vouches for a name.
func (l *Listed) AuthorizeImpersonationNames(_ context.Context, caller authn.Identity, target spiffeid.ID, dnsNames []string) error {
	return fmt.Errorf("%w: DNS names %q for %s: the identities of node agent %s, listed with --ca-node-agent, carry no DNS names; "+
		"drop the dnsNames of the agent's identity map rule for it", ErrNotAuthorized, dnsNames, target, caller.ID)
}

// Impersonator is what certservice asks (its Impersonator interface).
type Impersonator interface {
	AuthorizeImpersonation(ctx context.Context, caller authn.Identity, target spiffeid.ID) error
}

// NameImpersonator is an Impersonator that may also grant DNS names
// (certservice's NameImpersonator interface).
type NameImpersonator interface {
	AuthorizeImpersonationNames(ctx context.Context, caller authn.Identity, target spiffeid.ID, dnsNames []string) error
}

// Either decides with listed for a listed node agent and with other (the
// Kubernetes node authorizer; nil for none) for any other caller. What it
// returns is a NameImpersonator too: DNS names are granted only by an
// other that is one.
func Either(listed *Listed, other Impersonator) Impersonator {
	return either{listed: listed, other: other}
}

type either struct {
	listed *Listed
	other  Impersonator
}

func (e either) AuthorizeImpersonation(ctx context.Context, caller authn.Identity, target spiffeid.ID) error {
	if e.listed != nil && e.listed.Lists(caller.ID) {
		return e.listed.AuthorizeImpersonation(ctx, caller, target)
	}
	if e.other == nil {
		return fmt.Errorf("%s is not a node agent listed with --ca-node-agent", caller.ID)
	}
	return e.other.AuthorizeImpersonation(ctx, caller, target)
}

// AuthorizeImpersonationNames decides as AuthorizeImpersonation does,
// refusing names that other cannot judge.
func (e either) AuthorizeImpersonationNames(ctx context.Context, caller authn.Identity, target spiffeid.ID, dnsNames []string) error {
	if e.listed != nil && e.listed.Lists(caller.ID) {
		return e.listed.AuthorizeImpersonationNames(ctx, caller, target, dnsNames)
	}
	n, ok := e.other.(NameImpersonator)
	if !ok {
		return fmt.Errorf("%s is not a node agent listed with --ca-node-agent, and no node authorizer grants DNS names", caller.ID)
	}
	return n.AuthorizeImpersonationNames(ctx, caller, target, dnsNames)
}
