package crd

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/federation/managed"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func webEndpoint(t *testing.T, td, u string) federation.Endpoint {
	t.Helper()
	pu, err := url.Parse(u)
	require.NoError(t, err)
	return federation.Endpoint{TrustDomain: spiffeid.RequireTrustDomainFromString(td), URL: pu, Profile: federation.ProfileHTTPSWeb}
}

// federation add|remove with Kubernetes storage write resources of the
// server's class, which its controller applies.
func TestManagerWritesResources(t *testing.T) {
	f := newFixture(t, nil)
	var changes []string
	m, err := NewManager(ManagerConfig{
		Dynamic: f.dyn, Controller: f.ctrl, ClassName: f.class, Local: spiffeid.RequireTrustDomainFromString("local.test"),
		Reserved: map[spiffeid.TrustDomain]string{spiffeid.RequireTrustDomainFromString("flag.test"): "--federate"},
		OnChange: func(c managed.Change) { changes = append(changes, c.Kind+" "+c.TrustDomain.Name()+" "+c.Actor) },
	})
	require.NoError(t, err)
	ctx := context.Background()
	td := "mgr-" + f.class + ".test"
	t.Cleanup(func() { _ = f.dyn.Resource(GVR).Delete(ctx, td, metav1.DeleteOptions{}) })

	require.NoError(t, m.Add(ctx, webEndpoint(t, td, "https://a.test/"), managed.AddOptions{Actor: "op"}))
	f.waitApplied(td + "|https://a.test/")
	assert.ErrorIs(t, m.Add(ctx, webEndpoint(t, td, "https://b.test/"), managed.AddOptions{}), managed.ErrExists)
	require.NoError(t, m.Add(ctx, webEndpoint(t, td, "https://b.test/"), managed.AddOptions{Force: true, Actor: "op"}))
	f.waitApplied(td + "|https://b.test/")

	b := testca.New(t, td).Bundle()
	kind, err := m.SetBundle(ctx, b, "op")
	require.NoError(t, err)
	assert.Equal(t, managed.KindBootstrap, kind)
	got, err := f.dyn.Resource(GVR).Get(ctx, td, metav1.GetOptions{})
	require.NoError(t, err)
	var cr ClusterFederatedTrustDomain
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &cr))
	assert.Equal(t, f.class, cr.Spec.ClassName)
	assert.NotEmpty(t, cr.Spec.TrustDomainBundle)

	// --force without a bundle keeps the bootstrap bundle.
	require.NoError(t, m.Add(ctx, webEndpoint(t, td, "https://c.test/"), managed.AddOptions{Force: true, Actor: "op"}))
	f.waitApplied(td + "|https://c.test/")
	got, err = f.dyn.Resource(GVR).Get(ctx, td, metav1.GetOptions{})
	require.NoError(t, err)
	var replaced ClusterFederatedTrustDomain
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &replaced))
	assert.Equal(t, "https://c.test/", replaced.Spec.BundleEndpointURL)
	assert.Equal(t, cr.Spec.TrustDomainBundle, replaced.Spec.TrustDomainBundle)

	refusals := []struct {
		name string
		err  error
		do   func() error
	}{
		{"own", managed.ErrInvalid, func() error { return m.Add(ctx, webEndpoint(t, "local.test", "https://l/"), managed.AddOptions{}) }},
		{"flag", managed.ErrReserved, func() error {
			return m.Remove(ctx, spiffeid.RequireTrustDomainFromString("flag.test"), managed.RemoveOptions{})
		}},
		{"unknown", managed.ErrNotFound, func() error {
			return m.Remove(ctx, spiffeid.RequireTrustDomainFromString("nope.test"), managed.RemoveOptions{})
		}},
		{"static bundle", managed.ErrInvalid, func() error { _, err := m.SetBundle(ctx, testca.New(t, "nope.test").Bundle(), ""); return err }},
	}
	for _, r := range refusals {
		assert.ErrorIs(t, r.do(), r.err, r.name)
	}

	require.NoError(t, m.Remove(ctx, spiffeid.RequireTrustDomainFromString(td), managed.RemoveOptions{Actor: "op"}))
	f.waitApplied()
	assert.Equal(t, []string{"federation_added " + td + " op", "federation_replaced " + td + " op", "bootstrap_bundle_set " + td + " op", "federation_replaced " + td + " op", "federation_removed " + td + " op"}, changes)
}

func TestResourceName(t *testing.T) {
	long := strings.Repeat("a", 250) + ".example"
	for _, tt := range []struct{ td, want string }{
		{"partner.example", "partner.example"},
		{"a-b.example", "a-b.example"},
		{"a_b.example", "a-b.example-"},
		{"_x.example", "x.example-"},
		{long, strings.Repeat("a", 244) + "-"},
		{"a_.example", "td-"},
		{"x._b.example", "td-"},
		{"a..b", "td-"},
	} {
		td := spiffeid.RequireTrustDomainFromString(tt.td)
		got := ResourceName(td)
		assert.True(t, strings.HasPrefix(got, tt.want), "%s: %s", tt.td, got)
		assert.Empty(t, validation.IsDNS1123Subdomain(got), "%s: %s", tt.td, got)
	}
	assert.NotEqual(t, ResourceName(spiffeid.RequireTrustDomainFromString("a_b.example")), ResourceName(spiffeid.RequireTrustDomainFromString("a-b.example")))
}
