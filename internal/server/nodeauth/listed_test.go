package nodeauth

import (
	"context"
	"errors"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/authn"
)

var listedTD = spiffeid.RequireTrustDomainFromString("example.org")

func TestParseListed(t *testing.T) {
	for _, tc := range []struct {
		values []string
		want   string
	}{
		{[]string{"spiffe://example.org/vm/a"}, `want "AGENT_SPIFFE_ID=ID[,ID...]"`},
		{[]string{"spiffe://example.org/vm/a="}, `want "AGENT_SPIFFE_ID=ID[,ID...]"`},
		{[]string{"spiffe://other.org/vm/a=spiffe://example.org/x"}, "is not a SPIFFE ID of a workload of example.org"},
		{[]string{"spiffe://example.org=spiffe://example.org/x"}, "is not a SPIFFE ID of a workload of example.org"},
		{[]string{"spiffe://example.org/vm/a=spiffe://other.org/x"}, "is not of example.org"},
		{[]string{"spiffe://example.org/vm/a=not-an-id"}, `identity "not-an-id"`},
		{[]string{"spiffe://example.org/vm/a=spiffe://example.org/vm/*"}, "covers the node agent's own ID"},
		{[]string{"spiffe://example.org/vm/a=spiffe://example.org/x", "spiffe://example.org/vm/a=spiffe://example.org/y"}, "listed twice"},
		{[]string{"spiffe://example.org/vm/a=spiffe://example.org/trustbridge/*"}, "covers the server's own identity (spiffe://example.org/trustbridge/ca)"},
		{[]string{"spiffe://example.org/vm/a=spiffe://example.org/node/*", "spiffe://example.org/node/b=spiffe://example.org/node/b/app"}, "covers another node agent (spiffe://example.org/node/b)"},
	} {
		_, err := ParseListed(listedTD, tc.values, spiffeid.RequireFromString("spiffe://example.org/trustbridge/ca"))
		require.Error(t, err, "%q", tc.values)
		assert.Contains(t, err.Error(), tc.want)
	}
}

// A listed agent gets exactly what is listed for it, exact IDs and
// prefixes, nothing else; an agent not listed is refused.
func TestListedAuthorize(t *testing.T) {
	l, err := ParseListed(listedTD, []string{"spiffe://example.org/vm/a = spiffe://example.org/vm/a/app, spiffe://example.org/jobs/a/*"})
	require.NoError(t, err)
	agent := authn.Identity{ID: spiffeid.RequireFromString("spiffe://example.org/vm/a")}
	for target, ok := range map[string]bool{
		"spiffe://example.org/vm/a/app":       true,
		"spiffe://example.org/jobs/a/nightly": true,
		"spiffe://example.org/vm/a/app/x":     false,
		"spiffe://example.org/vm/a/db":        false,
		"spiffe://example.org/jobs/ab":        false,
		"spiffe://example.org/jobs/b/x":       false,
	} {
		err := l.AuthorizeImpersonation(t.Context(), agent, spiffeid.RequireFromString(target))
		assert.Equal(t, ok, err == nil, "%s: %v", target, err)
	}
	other := authn.Identity{ID: spiffeid.RequireFromString("spiffe://example.org/vm/b")}
	assert.ErrorContains(t, l.AuthorizeImpersonation(t.Context(), other, spiffeid.RequireFromString("spiffe://example.org/vm/a/app")), "not a node agent listed")
	assert.Equal(t, []string{"spiffe://example.org/vm/a"}, l.Agents())
}

type answer struct{ err error }

func (a answer) AuthorizeImpersonation(context.Context, authn.Identity, spiffeid.ID) error {
	return a.err
}

// A listed agent is decided by its list alone, even when the other
// authorizer would grant it; anyone else by the other, or refused.
func TestEither(t *testing.T) {
	l, err := ParseListed(listedTD, []string{"spiffe://example.org/vm/a=spiffe://example.org/vm/a/app"})
	require.NoError(t, err)
	agent := authn.Identity{ID: spiffeid.RequireFromString("spiffe://example.org/vm/a")}
	pod := authn.Identity{ID: spiffeid.RequireFromString("spiffe://example.org/ns/istio-system/sa/ztunnel")}
	db := spiffeid.RequireFromString("spiffe://example.org/vm/a/db")

	grantAll := Either(l, answer{})
	assert.Error(t, grantAll.AuthorizeImpersonation(t.Context(), agent, db), "the list, not the other authorizer")
	assert.NoError(t, grantAll.AuthorizeImpersonation(t.Context(), pod, db), "the other authorizer decides for the rest")
	refuse := errors.New("no pod")
	assert.ErrorIs(t, Either(l, answer{refuse}).AuthorizeImpersonation(t.Context(), pod, db), refuse)
	assert.ErrorContains(t, Either(l, nil).AuthorizeImpersonation(t.Context(), pod, db), "not a node agent listed")
}

// nameAnswer is an answer that also judges DNS names.
type nameAnswer struct {
	answer
	namesErr error
}

func (a nameAnswer) AuthorizeImpersonationNames(context.Context, authn.Identity, spiffeid.ID, []string) error {
	return a.namesErr
}

// DNS names: never for a listed agent, even one whose ID is listed;
// for anyone else, only from another authorizer that judges names.
func TestEitherNames(t *testing.T) {
	l, err := ParseListed(listedTD, []string{"spiffe://example.org/vm/a=spiffe://example.org/vm/a/app"})
	require.NoError(t, err)
	agent := authn.Identity{ID: spiffeid.RequireFromString("spiffe://example.org/vm/a")}
	pod := authn.Identity{ID: spiffeid.RequireFromString("spiffe://example.org/ns/istio-system/sa/ztunnel")}
	app := spiffeid.RequireFromString("spiffe://example.org/vm/a/app")
	names := []string{"app.vm.internal"}

	grantAll := Either(l, nameAnswer{}).(NameImpersonator)
	require.NoError(t, Either(l, nameAnswer{}).AuthorizeImpersonation(t.Context(), agent, app), "the ID alone is listed")
	err = grantAll.AuthorizeImpersonationNames(t.Context(), agent, app, names)
	require.ErrorIs(t, err, ErrNotAuthorized, "the list, not the other authorizer")
	assert.ErrorContains(t, err, "listed with --ca-node-agent, carry no DNS names")
	assert.NoError(t, grantAll.AuthorizeImpersonationNames(t.Context(), pod, app, names), "the other authorizer decides for the rest")
	refuse := errors.New("not these names")
	assert.ErrorIs(t, Either(l, nameAnswer{namesErr: refuse}).(NameImpersonator).AuthorizeImpersonationNames(t.Context(), pod, app, names), refuse)
	assert.ErrorContains(t, Either(l, answer{}).(NameImpersonator).AuthorizeImpersonationNames(t.Context(), pod, app, names), "no node authorizer grants DNS names")
	assert.ErrorContains(t, Either(l, nil).(NameImpersonator).AuthorizeImpersonationNames(t.Context(), pod, app, names), "no node authorizer grants DNS names")
}
