package crd

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/federation/managed"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// federation update with Kubernetes storage edits the resource from the
// endpoint its controller applied; add --force keeps https_spiffe unless
// told; bundle delete has no resource form.
func TestManagerUpdatesResources(t *testing.T) {
	f := newFixture(t, nil)
	var changes []string
	m, err := NewManager(ManagerConfig{
		Dynamic: f.dyn, Controller: f.ctrl, ClassName: f.class, Local: spiffeid.RequireTrustDomainFromString("local.test"),
		Others: func() []federation.Endpoint {
			f.mu.Lock()
			defer f.mu.Unlock()
			return slices.Clone(f.applied)
		},
		OnChange: func(c managed.Change) { changes = append(changes, c.Kind+" "+c.TrustDomain.Name()+" "+c.Actor) },
	})
	require.NoError(t, err)
	ctx := context.Background()
	name := "upd-" + f.class + ".test"
	td := spiffeid.RequireTrustDomainFromString(name)
	t.Cleanup(func() { _ = f.dyn.Resource(GVR).Delete(ctx, name, metav1.DeleteOptions{}) })

	ep := webEndpoint(t, name, "https://a.test/")
	ep.Profile, ep.EndpointSPIFFEID = federation.ProfileHTTPSSPIFFE, spiffeid.RequireFromString("spiffe://"+name+"/be")
	ep.BootstrapBundle = testca.New(t, name).Bundle()
	require.NoError(t, m.Add(ctx, ep, managed.AddOptions{Actor: "op"}))
	f.waitApplied(name + "|https://a.test/|spiffe://" + name + "/be")

	err = m.Add(ctx, webEndpoint(t, name, "https://b.test/"), managed.AddOptions{Force: true})
	require.ErrorIs(t, err, managed.ErrExists)
	assert.ErrorContains(t, err, "is federated by https_spiffe")

	require.NoError(t, m.Update(ctx, td, func(old federation.Endpoint) (federation.Endpoint, error) {
		old.URL = &url.URL{Scheme: "https", Host: "b.test", Path: "/"}
		return old, nil
	}, managed.AddOptions{Actor: "op"}))
	f.waitApplied(name + "|https://b.test/|spiffe://" + name + "/be")

	err = m.Update(ctx, spiffeid.RequireTrustDomainFromString("nope.test"), func(old federation.Endpoint) (federation.Endpoint, error) { return old, nil }, managed.AddOptions{})
	assert.ErrorIs(t, err, managed.ErrNotFound)
	err = m.Remove(ctx, td, managed.RemoveOptions{BundleOnly: true})
	require.ErrorIs(t, err, managed.ErrInvalid)
	assert.ErrorContains(t, err, "stop federating with "+name+" with trustbridge federation remove")
	assert.Equal(t, []string{"federation_added " + name + " op", "federation_updated " + name + " op"}, changes)
}

// federation update patches the spec it reads, not the endpoint the
// controller last applied: a direct edit the controller has not applied
// yet (here: never, Others stays as it was) survives, and one made between
// the update's read and its write is a conflict, patched again rather
// than overwritten.
func TestManagerUpdateKeepsDirectEdits(t *testing.T) {
	f := newFixture(t, nil)
	var stale []federation.Endpoint
	m, err := NewManager(ManagerConfig{
		Dynamic: f.dyn, Controller: f.ctrl, ClassName: f.class, Local: spiffeid.RequireTrustDomainFromString("local.test"),
		Others: func() []federation.Endpoint { return slices.Clone(stale) },
	})
	require.NoError(t, err)
	ctx := context.Background()
	name := "keep-" + f.class + ".test"
	td := spiffeid.RequireTrustDomainFromString(name)
	t.Cleanup(func() { _ = f.dyn.Resource(GVR).Delete(ctx, name, metav1.DeleteOptions{}) })
	require.NoError(t, m.Add(ctx, webEndpoint(t, name, "https://a.test/"), managed.AddOptions{}))
	f.waitApplied(name + "|https://a.test/")
	f.mu.Lock()
	stale = slices.Clone(f.applied)
	f.mu.Unlock()

	f.update(name, func(spec map[string]any) { spec["refresh"] = map[string]any{"min": "2m"} })
	var seen []federation.Refresh
	require.NoError(t, m.Update(ctx, td, func(old federation.Endpoint) (federation.Endpoint, error) {
		seen = append(seen, old.Refresh)
		if len(seen) == 1 {
			// kubectl edit between the update's read and its write.
			f.update(name, func(spec map[string]any) { spec["refresh"].(map[string]any)["max"] = "1h" })
		}
		old.URL = &url.URL{Scheme: "https", Host: "b.test", Path: "/"}
		return old, nil
	}, managed.AddOptions{}))
	assert.Equal(t, []federation.Refresh{{Min: 2 * time.Minute}, {Min: 2 * time.Minute, Max: time.Hour}}, seen,
		"the patch is made on the spec read, again after the conflict")
	got, _, err := Endpoint(f.get(name).Spec)
	require.NoError(t, err)
	assert.Equal(t, "https://b.test/", got.URL.String(), "the update")
	assert.Equal(t, federation.Refresh{Min: 2 * time.Minute, Max: time.Hour}, got.Refresh, "both direct edits")

	// An edit the controller refuses is not overwritten either: the
	// update fails (saying so while the resource still configures td).
	f.update(name, func(spec map[string]any) { spec["refresh"] = map[string]any{"min": "1ms"} })
	err = m.Update(ctx, td, func(old federation.Endpoint) (federation.Endpoint, error) {
		old.URL = &url.URL{Scheme: "https", Host: "c.test", Path: "/"}
		return old, nil
	}, managed.AddOptions{})
	require.Error(t, err)
	if errors.Is(err, managed.ErrInvalid) {
		assert.ErrorContains(t, err, "ClusterFederatedTrustDomain "+name+"'s spec is invalid (refresh min 1ms is outside")
	}
	spec := f.get(name).Spec
	assert.Equal(t, "https://b.test/", spec.BundleEndpointURL)
	assert.Equal(t, "1ms", spec.Refresh.Min)
}
