package managed

import (
	"context"
	"errors"
	"net/url"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// Update changes only what its edit changes, persists it, probes it and
// is audited as federation_updated; what Add refuses, it refuses.
func TestUpdate(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, map[string]string{"flag.example": "--federate"})
	ctx := context.Background()
	peer := testca.New(t, "peer.example")
	td := spiffeid.RequireTrustDomainFromString("peer.example")
	require.NoError(t, h.m.Add(ctx, selfServing(t, "peer.example", peer.Bundle()), AddOptions{}))

	newURL := func(old federation.Endpoint) (federation.Endpoint, error) {
		old.URL = &url.URL{Scheme: "https", Host: "peer2.example:8443", Path: "/"}
		return old, nil
	}
	require.NoError(t, h.m.Update(ctx, td, newURL, AddOptions{Actor: "op"}))
	got := newHarness(t, dir, nil).inForce().Endpoints
	require.Len(t, got, 1)
	assert.Equal(t, "peer.example|https://peer2.example:8443/|spiffe://peer.example/trustbridge/bundle-endpoint", got[0].String(), "the profile and ID kept, the URL changed, after a restart too")
	assert.True(t, got[0].BootstrapBundle.Equal(peer.Bundle()), "the bootstrap bundle kept")
	last := h.changes[len(h.changes)-1]
	assert.Equal(t, []string{KindUpdated, "peer.example", "op", "https://peer2.example:8443/"}, []string{last.Kind, last.TrustDomain.Name(), last.Actor, last.EndpointURL})
	assert.Equal(t, []string{"endpoint URL https://peer.example:8443/ → https://peer2.example:8443/"}, last.Changes)
	assert.Nil(t, last.Bundle, "the kept bootstrap bundle is no change")

	h.probeErr = errors.New("connection refused")
	require.ErrorIs(t, h.m.Update(ctx, td, newURL, AddOptions{}), ErrFirstFetch)
	require.NoError(t, h.m.Update(ctx, td, newURL, AddOptions{NoProbe: true}))
	h.probeErr = nil

	_, err := h.m.SetBundle(ctx, testca.New(t, "static.example").Bundle(), "")
	require.NoError(t, err)
	before := h.m.State()
	tests := []struct {
		name string
		td   string
		edit Edit
		err  error
		msg  string
	}{
		{"own", "example.org", newURL, ErrInvalid, "this server's own trust domain"},
		{"configured by flag", "flag.example", newURL, ErrReserved, "flag.example is configured by --federate; change it there"},
		{"unknown", "nope.example", newURL, ErrNotFound, "nope.example has no endpoint added at run time (see trustbridge federation list); add it with trustbridge federation add"},
		{"static bundle only", "static.example", newURL, ErrNotFound, "static.example has a static bundle (bundle set) and no endpoint to update: give it one with trustbridge federation add"},
		{"edit fails", "peer.example", func(federation.Endpoint) (federation.Endpoint, error) {
			return federation.Endpoint{}, errors.New("bad URL")
		}, ErrInvalid, "bad URL"},
		{"another trust domain", "peer.example", func(old federation.Endpoint) (federation.Endpoint, error) {
			old.TrustDomain = spiffeid.RequireTrustDomainFromString("other.example")
			return old, nil
		}, ErrInvalid, "an update of peer.example cannot make it the endpoint of other.example"},
		{"unanchored", "peer.example", func(old federation.Endpoint) (federation.Endpoint, error) {
			old.BootstrapBundle = nil
			return old, nil
		}, federation.ErrNoBootstrapBundle, "no bundle to authenticate the first fetch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := h.m.Update(ctx, spiffeid.RequireTrustDomainFromString(tt.td), tt.edit, AddOptions{})
			require.ErrorIs(t, err, tt.err)
			assert.ErrorContains(t, err, tt.msg)
			assert.Equal(t, before, h.m.State(), "last good state kept")
		})
	}
}

// An update's Change says which of the URL, profile and endpoint SPIFFE
// ID changed, old → new, and carries the bootstrap bundle only when it is
// a new one.
func TestUpdatedChange(t *testing.T) {
	peer, other := testca.New(t, "peer.example"), testca.New(t, "peer.example")
	old := selfServing(t, "peer.example", peer.Bundle())
	web := old
	web.Profile, web.EndpointSPIFFEID, web.BootstrapBundle = federation.ProfileHTTPSWeb, spiffeid.ID{}, nil
	c := Updated(old, web, "admin-socket")
	assert.Equal(t, []string{"profile https_spiffe → https_web", "endpoint SPIFFE ID spiffe://peer.example/trustbridge/bundle-endpoint → (none)"}, c.Changes)
	assert.Nil(t, c.Bundle)

	moved := old
	moved.EndpointSPIFFEID = spiffeid.RequireFromString("spiffe://peer.example/spire/server")
	moved.BootstrapBundle = other.Bundle()
	c = Updated(old, moved, "admin-token")
	assert.Equal(t, []string{"endpoint SPIFFE ID spiffe://peer.example/trustbridge/bundle-endpoint → spiffe://peer.example/spire/server", "bootstrap bundle replaced"}, c.Changes)
	assert.True(t, other.Bundle().Equal(c.Bundle), "the new bootstrap bundle")
	assert.Equal(t, []string{KindUpdated, "peer.example", "admin-token"}, []string{c.Kind, c.TrustDomain.Name(), c.Actor})

	kept := old
	kept.BootstrapBundle = peer.Bundle().Clone()
	assert.Empty(t, Updated(old, kept, "x").Changes)
	assert.Nil(t, Updated(old, kept, "x").Bundle)
}

// add --force never turns https_spiffe into https_web without being
// told: the replacement is refused, and what is in force stays.
func TestForceKeepsTheProfile(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	peer := testca.New(t, "peer.example")
	require.NoError(t, h.m.Add(ctx, selfServing(t, "peer.example", peer.Bundle()), AddOptions{}))
	before := h.m.State()

	err := h.m.Add(ctx, web(t, "peer.example", "https://peer2.example/"), AddOptions{Force: true})
	require.ErrorIs(t, err, ErrExists)
	assert.EqualError(t, err, "trust domain already federated: peer.example is federated by https_spiffe (endpoint SPIFFE ID spiffe://peer.example/trustbridge/bundle-endpoint), and the replacement is https_web: "+
		"pass --endpoint-spiffe-id to keep https_spiffe, or change only what you give with trustbridge federation update (--profile https_web to switch on purpose)")
	assert.Equal(t, before, h.m.State())

	// With the profile stated, --force replaces; https_web to
	// https_spiffe is stated by its ID.
	moved := selfServing(t, "peer.example", nil)
	moved.URL = &url.URL{Scheme: "https", Host: "peer2.example", Path: "/"}
	require.NoError(t, h.m.Add(ctx, moved, AddOptions{Force: true}))
	require.NoError(t, h.m.Add(ctx, web(t, "web.example", "https://web.example/"), AddOptions{}))
	require.NoError(t, h.m.Add(ctx, selfServing(t, "web.example", testca.New(t, "web.example").Bundle()), AddOptions{Force: true}))
}

// Remove with BundleOnly (bundle delete) removes a static bundle and
// nothing else.
func TestRemoveBundleOnly(t *testing.T) {
	h := newHarness(t, t.TempDir(), map[string]string{"file.example": "--federation-config"})
	ctx := context.Background()
	_, err := h.m.SetBundle(ctx, testca.New(t, "static.example").Bundle(), "")
	require.NoError(t, err)
	require.NoError(t, h.m.Add(ctx, web(t, "web.example", "https://web.example/"), AddOptions{}))
	before := h.m.State()

	for _, tt := range []struct {
		td, msg string
		err     error
	}{
		{"web.example", "trust domain already federated: web.example is federated by its endpoint web.example|https://web.example/ (added at run time), where its bundle comes from: stop federating with it with trustbridge federation remove", ErrExists},
		{"example.org", "invalid change: example.org is this server's own trust domain; its bundle comes from our CA", ErrInvalid},
		{"file.example", "trust domain configured elsewhere: file.example is configured by --federation-config; change it there", ErrReserved},
		{"nope.example", "trust domain not managed: nope.example has no bundle set at run time with bundle set (see trustbridge bundle list)", ErrNotFound},
	} {
		err := h.m.Remove(ctx, spiffeid.RequireTrustDomainFromString(tt.td), RemoveOptions{BundleOnly: true})
		require.ErrorIs(t, err, tt.err, tt.td)
		assert.EqualError(t, err, tt.msg)
		assert.Equal(t, before, h.m.State())
	}

	require.NoError(t, h.m.Remove(ctx, spiffeid.RequireTrustDomainFromString("static.example"), RemoveOptions{Actor: "op", BundleOnly: true}))
	eps, bundles := names(h.inForce())
	assert.Equal(t, []string{"web.example"}, eps)
	assert.Empty(t, bundles)
	last := h.changes[len(h.changes)-1]
	assert.Equal(t, []string{KindStaticUnset, "static.example", "op"}, []string{last.Kind, last.TrustDomain.Name(), last.Actor})
}
