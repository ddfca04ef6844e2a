package mapcrd

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// The tests against a real API server (internal/testkit/kubetest) skip
// without one, unless TRUSTBRIDGE_KUBE_TESTS=require.
func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

var (
	crdPath = filepath.Join("..", "..", "..", "..", "deploy", "base", "identitymapping-crd.yaml")
	local   = spiffeid.RequireTrustDomainFromString("example.org")
)

// kube runs a Controller feeding a real Combiner against the API server.
type kube struct {
	t    *testing.T
	dyn  dynamic.Interface
	comb *identitymap.Combiner
	cell *identitymap.Cell
	ctl  *Controller
}

func newKube(t *testing.T) *kube {
	t.Helper()
	e := kubetest.Shared(t)
	dyn := e.InstallCRD(t, crdPath)
	k := &kube{t: t, dyn: dyn, cell: identitymap.NewCell(nil)}
	cfg := identitymap.Config{TrustDomain: local}
	var err error
	k.comb, err = identitymap.NewCombiner(cfg, k.cell)
	require.NoError(t, err)
	require.NoError(t, k.comb.SetSource("file:ids.yaml", []identitymap.Rule{{Name: "taken", Origin: "file:ids.yaml:3",
		Workloads: []identitymap.Selector{{Namespace: "elsewhere"}}, SPIFFEID: "spiffe://{{.TrustDomain}}/elsewhere"}}))
	k.ctl, err = New(Config{Dynamic: dyn, Events: e.Client, Map: cfg, Apply: CombinerApplier(k.comb), Current: k.comb.Map,
		Clock: clocktesting.NewFakeClock(time.Now()), Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.ctl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return k
}

func (k *kube) create(doc string) error {
	k.t.Helper()
	return kubetest.CreateYAML(k.t, k.dyn.Resource(GVR), doc)
}

// waitReady waits for name's Ready condition to have reason and returns
// the resource.
func (k *kube) waitReady(name, reason string) ClusterIdentityMapping {
	k.t.Helper()
	return kubetest.WaitReady[ClusterIdentityMapping](k.t, k.dyn.Resource(GVR), name, reason)
}

func readyMessage(cr ClusterIdentityMapping) string {
	return meta.FindStatusCondition(cr.Status.Conditions, ConditionReady).Message
}

func TestKubeController(t *testing.T) {
	k := newKube(t)
	require.NoError(t, k.create(`
apiVersion: trustbridge.dev/v1alpha1
kind: ClusterIdentityMapping
metadata: {name: pay-apps}
spec:
  workloads:
  - namespace: pay
  spiffeID: "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/app/{{.PodLabels.app}}"
  ttl: 1h
  dnsNames: ["{{.PodLabels.app}}.{{.Namespace}}.svc"]
`))
	cr := k.waitReady("pay-apps", ReasonAccepted)
	assert.Equal(t, "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/app/{{.PodLabels.app}}", cr.Status.SPIFFEID)
	require.NotNil(t, cr.Status.ServerChecks)
	assert.True(t, *cr.Status.ServerChecks)
	assert.Empty(t, cr.Status.Conflicts)
	<-k.ctl.Synced()
	ident, err := k.cell.Load().Identify(identitymap.ServerFacts("pay", "api", "api-1", "u1", "node-a", map[string]string{"app": "checkout"}))
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/ns/pay/app/checkout", ident.ID.String())
	assert.Equal(t, time.Hour, ident.TTL)
	assert.Equal(t, []string{"checkout.pay.svc"}, ident.DNSNames)

	// A second rule selecting the same pods with another ID: both stay in
	// force, each status names the conflict, the workloads get nothing.
	require.NoError(t, k.create(`
apiVersion: trustbridge.dev/v1alpha1
kind: ClusterIdentityMapping
metadata: {name: pay-by-account}
spec:
  workloads:
  - namespace: pay
    serviceAccount: api
  spiffeID: "spiffe://{{.TrustDomain}}/pay/{{.ServiceAccount}}"
`))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for _, name := range []string{"pay-apps", "pay-by-account"} {
			cr := k.waitReady(name, ReasonAccepted)
			if assert.Len(c, cr.Status.Conflicts, 1, name) {
				assert.Contains(c, cr.Status.Conflicts[0], `rule "pay-apps" (crd:pay-apps) and rule "pay-by-account" (crd:pay-by-account)`)
			}
			assert.Contains(c, readyMessage(cr), "in conflict with 1 other rules", name)
		}
	}, 30*time.Second, 20*time.Millisecond)
	_, err = k.cell.Load().Identify(identitymap.ServerFacts("pay", "api", "api-1", "u1", "node-a", map[string]string{"app": "checkout"}))
	assert.ErrorIs(t, err, identitymap.ErrConflict)

	// The schema lets it through, the identity map refuses it: refused
	// alone, with the field, the others stay.
	require.NoError(t, k.create(`
apiVersion: trustbridge.dev/v1alpha1
kind: ClusterIdentityMapping
metadata: {name: bad-template}
spec:
  workloads:
  - namespace: web
  spiffeID: "spiffe://{{.TrustDomain}}/web/{{.Image}}"
`))
	cr = k.waitReady("bad-template", ReasonInvalid)
	assert.Contains(t, readyMessage(cr), "spec.spiffeID: ")
	assert.Contains(t, readyMessage(cr), "no valid generation to keep")
	assert.Equal(t, metav1.ConditionFalse, meta.FindStatusCondition(cr.Status.Conditions, ConditionReady).Status)
	assert.Len(t, k.comb.Map().Rules(), 3, "the file's rule and the two valid resources")

	// An invalid edit of a valid resource keeps its last valid generation
	// in force, and says so.
	u, err := k.dyn.Resource(GVR).Get(context.Background(), "pay-by-account", metav1.GetOptions{})
	require.NoError(t, err)
	require.NoError(t, unstructured.SetNestedField(u.Object, "spiffe://{{.TrustDomain}}/pay/{{.Nope}}", "spec", "spiffeID"))
	_, err = k.dyn.Resource(GVR).Update(context.Background(), u, metav1.UpdateOptions{})
	require.NoError(t, err)
	cr = k.waitReady("pay-by-account", ReasonInvalid)
	assert.Contains(t, readyMessage(cr), "; generation 1 stays in force")
	assert.Equal(t, "spiffe://{{.TrustDomain}}/pay/{{.ServiceAccount}}", cr.Status.SPIFFEID, "the template in force")
	_, err = k.cell.Load().Identify(identitymap.ServerFacts("pay", "api", "api-1", "u1", "node-a", map[string]string{"app": "checkout"}))
	assert.ErrorIs(t, err, identitymap.ErrConflict, "the rule in force still conflicts")

	// Only the node agent knows a uid: accepted, but the server never
	// grants its IDs, and the status says so.
	require.NoError(t, k.create(`
apiVersion: trustbridge.dev/v1alpha1
kind: ClusterIdentityMapping
metadata: {name: by-uid}
spec:
  workloads:
  - kubernetes: true
    uid: 1000
  spiffeID: "spiffe://{{.TrustDomain}}/uid/{{.UID}}"
`))
	cr = k.waitReady("by-uid", ReasonAccepted)
	require.NotNil(t, cr.Status.ServerChecks)
	assert.False(t, *cr.Status.ServerChecks)
	assert.Contains(t, readyMessage(cr), "never grants")

	// A name the file uses: the set is refused, the new rule is not in
	// force, the set before stays.
	require.NoError(t, k.create(`
apiVersion: trustbridge.dev/v1alpha1
kind: ClusterIdentityMapping
metadata: {name: taken}
spec:
  workloads:
  - namespace: other
  spiffeID: "spiffe://{{.TrustDomain}}/other"
`))
	cr = k.waitReady("taken", ReasonRefused)
	assert.Contains(t, readyMessage(cr), "same name")
	k.waitReady("pay-apps", ReasonAccepted)
}

// The schema refuses at admission what it can: a uid out of range, an
// empty selector, a TTL that is no duration.
func TestKubeSchema(t *testing.T) {
	k := newKube(t)
	for name, spec := range map[string]string{
		"bad-uid":       `{workloads: [{uid: -1}], spiffeID: "spiffe://{{.TrustDomain}}/x"}`,
		"empty-sel":     `{workloads: [{}], spiffeID: "spiffe://{{.TrustDomain}}/x"}`,
		"no-workloads":  `{workloads: [], spiffeID: "spiffe://{{.TrustDomain}}/x"}`,
		"bad-ttl":       `{workloads: [{namespace: a}], spiffeID: "spiffe://{{.TrustDomain}}/x", ttl: "1 hour"}`,
		"not-spiffe":    `{workloads: [{namespace: a}], spiffeID: "https://example.org/x"}`,
		"bad-namespace": `{workloads: [{namespace: A_B}], spiffeID: "spiffe://{{.TrustDomain}}/x"}`,
	} {
		err := k.create("apiVersion: trustbridge.dev/v1alpha1\nkind: ClusterIdentityMapping\nmetadata: {name: " + name + "}\nspec: " + spec)
		assert.Error(t, err, name)
	}
}
