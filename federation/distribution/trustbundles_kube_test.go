package distribution

import (
	"context"
	"crypto/x509"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// ctbRig is one TrustBundles controller on the shared API server, with a
// signer name of its own: tests run in parallel on one cluster.
type ctbRig struct {
	env    *kubetest.Env
	signer string
	store  *trust.Store
	cas    map[string]*testca.CA
	reg    *prometheus.Registry
	ctrl   *TrustBundles
}

func newCTBRig(t *testing.T, federated ...string) *ctbRig {
	t.Helper()
	return newCTBRigAs(t, nil, randomName("t")+".trustbridge.test/svid", federated...)
}

// newCTBRigAs runs the controller with client (nil: the cluster admin)
// for signer.
func newCTBRigAs(t *testing.T, client kubernetes.Interface, signer string, federated ...string) *ctbRig {
	t.Helper()
	env := kubetest.Shared(t)
	if client == nil {
		client = env.Client
	}
	store, cas := newStore(t, federated...)
	r := &ctbRig{env: env, signer: signer, store: store, cas: cas, reg: prometheus.NewRegistry()}
	c, err := NewTrustBundles(TrustBundleConfig{Client: client, Store: store, SignerName: r.signer, Registerer: r.reg})
	require.NoError(t, err)
	r.ctrl = c
	t.Cleanup(func() {
		// Cluster-scoped: nothing else removes them.
		for _, b := range r.list(t) {
			_ = env.Client.CertificatesV1beta1().ClusterTrustBundles().Delete(context.Background(), b.Name, metav1.DeleteOptions{})
		}
	})
	return r
}

func (r *ctbRig) start(t *testing.T) {
	t.Helper()
	startController(t, r.ctrl)
	require.Eventually(t, func() bool { return r.ctrl.Ready() == nil }, waitFor, tick)
}

// list is every ClusterTrustBundle linked to the rig's signer.
func (r *ctbRig) list(t *testing.T) []certv1beta1.ClusterTrustBundle {
	t.Helper()
	l, err := r.env.Client.CertificatesV1beta1().ClusterTrustBundles().List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.signerName", r.signer).String(),
	})
	require.NoError(t, err)
	return l.Items
}

// podView is what a pod's clusterTrustBundle projection of our signer
// and the trust domain label would mount: the roots of every matching
// bundle.
func (r *ctbRig) podView(t require.TestingT, td string) []*x509.Certificate {
	l, err := r.env.Client.CertificatesV1beta1().ClusterTrustBundles().List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.signerName", r.signer).String(),
		LabelSelector: labels.SelectorFromSet(labels.Set{TrustDomainLabel: td}).String(),
	})
	require.NoError(t, err)
	var roots []*x509.Certificate
	for _, b := range l.Items {
		roots = append(roots, parsePEM(t, b.Spec.TrustBundle)...)
	}
	return roots
}

// waitRoots waits until the pod view of td is exactly roots.
func (r *ctbRig) waitRoots(t *testing.T, td string, roots ...*x509.Certificate) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got := r.podView(c, td)
		require.Len(c, got, len(roots))
		for i := range roots {
			assert.True(c, slices.ContainsFunc(got, roots[i].Equal), "root %d of %s", i, td)
		}
	}, waitFor, tick)
}

func TestKubeClusterTrustBundles(t *testing.T) {
	t.Parallel()
	r := newCTBRig(t, "peer.example")
	r.start(t)
	r.waitRoots(t, localTD, r.cas[localTD].Cert)
	r.waitRoots(t, "peer.example", r.cas["peer.example"].Cert)
	for _, b := range r.list(t) {
		assert.Equal(t, ManagedByValue, b.Labels[ManagedByLabel])
		assert.Equal(t, b.Labels[TrustDomainLabel], b.Annotations[TrustDomainAnnotation])
		assert.Equal(t, r.signer, b.Spec.SignerName)
	}

	t.Run("peer added", func(t *testing.T) {
		north := testca.New(t, "north.example")
		r.store.Set("federation", north.Bundle())
		r.waitRoots(t, "north.example", north.Cert)
	})
	t.Run("local roots rotated", func(t *testing.T) {
		old, next := r.cas[localTD], testca.New(t, localTD)
		r.store.Set("ca", bundleOf(localTD, old.Cert, next.Cert))
		r.waitRoots(t, localTD, old.Cert, next.Cert)
		r.store.Set("ca", next.Bundle())
		r.waitRoots(t, localTD, next.Cert)
		r.waitRoots(t, "peer.example", r.cas["peer.example"].Cert) // untouched
	})
	t.Run("peer removed", func(t *testing.T) {
		r.store.Remove("federation", spiffeid.RequireTrustDomainFromString("north.example"))
		r.waitRoots(t, "north.example")
		assert.Len(t, r.list(t), 2)
	})
	t.Run("edited and deleted bundles restored", func(t *testing.T) {
		api := r.env.Client.CertificatesV1beta1().ClusterTrustBundles()
		name := trustBundleName(r.signer, spiffeid.RequireTrustDomainFromString("peer.example"))
		b, err := api.Get(context.Background(), name, metav1.GetOptions{})
		require.NoError(t, err)
		intruder := testca.New(t, "peer.example")
		b.Spec.TrustBundle = string(testca.PEM(intruder.Cert))
		_, err = api.Update(context.Background(), b, metav1.UpdateOptions{})
		require.NoError(t, err)
		r.waitRoots(t, "peer.example", r.cas["peer.example"].Cert)

		require.NoError(t, api.Delete(context.Background(), name, metav1.DeleteOptions{}))
		r.waitRoots(t, "peer.example", r.cas["peer.example"].Cert)
	})
	assert.Equal(t, 0.0, metricValue(t, r.reg, "trustbridge_cluster_trust_bundle_writes_total", map[string]string{"result": resultError}))
}

// A bundle of our name that trustbridge did not write (no managed-by
// label) is left alone, counted, and never deleted; a trust domain with no
// CA certificate gets no bundle and shows as skipped.
func TestKubeClusterTrustBundlesForeignAndSkipped(t *testing.T) {
	t.Parallel()
	r := newCTBRig(t)
	api := r.env.Client.CertificatesV1beta1().ClusterTrustBundles()
	squatter := testca.New(t, "squat.example")
	name := trustBundleName(r.signer, spiffeid.RequireTrustDomainFromString("squat.example"))
	_, err := api.Create(context.Background(), &certv1beta1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       certv1beta1.ClusterTrustBundleSpec{SignerName: r.signer, TrustBundle: string(testca.PEM(squatter.Cert))},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	r.start(t)
	r.store.Set("federation", testca.New(t, "squat.example").Bundle())
	leafOnly := testca.New(t, "leafy.example")
	leaf, _ := leafOnly.Issue(t, spiffeid.RequireFromString("spiffe://leafy.example/w"))
	r.store.Set("federation", bundleOf("leafy.example", leaf))

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.GreaterOrEqual(c, metricValue(c, r.reg, "trustbridge_cluster_trust_bundle_foreign_total", nil), 1.0)
		assert.Equal(c, 1.0, metricValue(c, r.reg, "trustbridge_cluster_trust_bundles_skipped",
			map[string]string{"trust_domain": "leafy.example", "reason": reasonNoCAAuthorities}))
	}, waitFor, tick)
	b, err := api.Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, string(testca.PEM(squatter.Cert)), b.Spec.TrustBundle, "a bundle trustbridge does not own is never rewritten")
	assert.Equal(t, reasonNoCAAuthorities, r.ctrl.Skipped()["leafy.example"].Reason)
	_, err = api.Get(context.Background(), trustBundleName(r.signer, spiffeid.RequireTrustDomainFromString("leafy.example")), metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "no bundle for a trust domain without CA certificates: %v", err)
}

// TestKubeClusterTrustBundlesRBAC runs the controller as deploy/rbac's
// service account with deploy/rbac/pod-identity: it keeps the bundles of
// its signer, and may not write one linked to another signer.
func TestKubeClusterTrustBundlesRBAC(t *testing.T) {
	env := kubetest.Shared(t)
	env.Apply(t, []string{systemNamespace}, kubetest.LoadManifests(t, rbacDir+"/pod-identity"))
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: serviceAccountID}
	sa, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)

	r := newCTBRigAs(t, sa, "trustbridge.io/svid", "peer.example")
	r.start(t)
	r.waitRoots(t, localTD, r.cas[localTD].Cert)
	r.waitRoots(t, "peer.example", r.cas["peer.example"].Cert)
	r.store.Remove("federation", spiffeid.RequireTrustDomainFromString("peer.example"))
	r.waitRoots(t, "peer.example")
	assert.Equal(t, 0.0, metricValue(t, r.reg, "trustbridge_cluster_trust_bundle_writes_total", map[string]string{"result": resultError}))

	_, err = sa.CertificatesV1beta1().ClusterTrustBundles().Create(context.Background(), &certv1beta1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: "other.trustbridge.test:svid:x"},
		Spec:       certv1beta1.ClusterTrustBundleSpec{SignerName: "other.trustbridge.test/svid", TrustBundle: string(testca.PEM(r.cas[localTD].Cert))},
	}, metav1.CreateOptions{})
	assert.ErrorContains(t, err, "attest", "attest is pinned to our signer")
}
