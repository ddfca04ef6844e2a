package distribution

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/trustbridge/trustbridge/federation/kubelkg"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

const (
	rbacDir          = "../../deploy/rbac"
	systemNamespace  = "trustbridge-system"
	serviceAccount   = "trustbridge"
	caSecret         = "trustbridge-ca"
	leaderLease      = "trustbridge-leader"
	serviceAccountID = "system:serviceaccount:" + systemNamespace + ":" + serviceAccount
)

func TestRBACManifests(t *testing.T) {
	objs := kubetest.LoadManifests(t, rbacDir)
	var kinds []string
	for _, obj := range objs {
		m, ok := obj.(metav1.Object)
		require.True(t, ok)
		kinds = append(kinds, obj.GetObjectKind().GroupVersionKind().Kind+"/"+m.GetNamespace()+"/"+m.GetName())
	}
	assert.ElementsMatch(t, []string{
		"ServiceAccount/trustbridge-system/trustbridge",
		"Role/trustbridge-system/trustbridge",
		"RoleBinding/trustbridge-system/trustbridge",
		"ClusterRole//trustbridge",
		"ClusterRoleBinding//trustbridge",
		"ValidatingAdmissionPolicy//trustbridge-configmap-create",
		"ValidatingAdmissionPolicyBinding//trustbridge-configmap-create",
		// Events about ClusterFederatedTrustDomains (cluster-scoped: they
		// land in default), and nowhere else.
		"Role/default/trustbridge-events",
		"RoleBinding/default/trustbridge-events",
	}, kinds)

	// The ClusterRole pins ConfigMaps to the default name; the controller
	// must be run with it.
	for _, obj := range objs {
		if cr, ok := obj.(*rbacv1.ClusterRole); ok {
			found := false
			for _, rule := range cr.Rules {
				if len(rule.ResourceNames) > 0 && rule.Resources[0] == "configmaps" {
					assert.Equal(t, []string{DefaultName}, rule.ResourceNames)
					found = true
				}
			}
			assert.True(t, found, "ClusterRole pins ConfigMaps to %s", DefaultName)
		}
		// So does the admission policy, for the service account of the
		// RBAC manifests.
		if p, ok := obj.(*admissionregistrationv1.ValidatingAdmissionPolicy); ok {
			require.Len(t, p.Spec.Validations, 1)
			assert.Contains(t, p.Spec.Validations[0].Expression, `"`+DefaultName+`"`)
			assert.Contains(t, p.Spec.Validations[0].Expression, `"`+systemNamespace+`"`)
			assert.Contains(t, p.Spec.Validations[0].Expression, `"`+kubelkg.DefaultPrefix+`"`)
			require.Len(t, p.Spec.MatchConditions, 1)
			assert.Contains(t, p.Spec.MatchConditions[0].Expression, `"`+serviceAccountID+`"`)
		}
	}
}

// TestKubeRBAC applies deploy/rbac to the real API server and acts as the
// service account: the distribution controller works with exactly these
// permissions, and what trustbridge must not do is refused.
func TestKubeRBAC(t *testing.T) {
	t.Parallel()
	env := kubetest.Shared(t)
	env.Apply(t, []string{systemNamespace}, kubetest.LoadManifests(t, rbacDir))

	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: serviceAccountID}
	sa, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	ctx := context.Background()

	t.Run("distribution controller", func(t *testing.T) {
		r := newKubeRig(t, sa, DefaultName)
		selected := r.namespace(t, true)
		leaving := r.namespace(t, true)
		r.start(t)
		r.waitCurrent(t, selected, leaving)

		require.NoError(t, env.Client.CoreV1().ConfigMaps(selected).Delete(ctx, DefaultName, metav1.DeleteOptions{}))
		r.waitCurrent(t, selected)
		r.setSelected(t, leaving, false)
		r.waitGone(t, leaving)
		r.store.Set("federation", newPeerBundle(t))
		r.waitCurrent(t, selected)
		assert.Equal(t, 0.0, metricValue(t, r.reg, "trustbridge_distribution_writes_total", map[string]string{"result": resultError}))
	})

	other := env.Namespace(t)
	_, err = env.Client.CoreV1().Secrets(systemNamespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "not-trustbridge"}, StringData: map[string]string{"k": "v"},
	}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	_, err = env.Client.CoreV1().ConfigMaps(other).Create(ctx, configMap(other, "app-config", nil, map[string]string{"k": "v"}), metav1.CreateOptions{})
	require.NoError(t, err)

	secrets := sa.CoreV1().Secrets(systemNamespace)
	byName := func(name string) metav1.ListOptions {
		return metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
	}
	// Allowed actions run in order: the Secret and the Lease are created
	// before they are read and updated.
	allowed := []struct {
		name string
		do   func() error
	}{
		// The node authorizer (ztunnel's ImpersonatedIdentity) watches pods.
		{"list pods", func() error { _, err := sa.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); return err }},
		{"create the CA Secret", func() error {
			_, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: caSecret}}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return nil
			}
			return err
		}},
		{"get the CA Secret", func() error { _, err := secrets.Get(ctx, caSecret, metav1.GetOptions{}); return err }},
		{"update the CA Secret", func() error {
			s, err := secrets.Get(ctx, caSecret, metav1.GetOptions{})
			if err != nil {
				return err
			}
			s.StringData = map[string]string{"state": time.Now().String()}
			_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
			return err
		}},
		{"list the CA Secret by name", func() error { _, err := secrets.List(ctx, byName(caSecret)); return err }},
		{"watch the CA Secret by name", func() error {
			w, err := secrets.Watch(ctx, byName(caSecret))
			if err == nil {
				w.Stop()
			}
			return err
		}},
		{"create a federated last-known-good ConfigMap", func() error {
			_, err := sa.CoreV1().ConfigMaps(systemNamespace).Create(ctx,
				configMap(systemNamespace, randomName(kubelkg.DefaultPrefix), nil, map[string]string{"bundle.json": "{}"}), metav1.CreateOptions{})
			return err
		}},
		{"create the leader Lease", func() error {
			_, err := sa.CoordinationV1().Leases(systemNamespace).Create(ctx,
				&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leaderLease}}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return nil
			}
			return err
		}},
		{"update the leader Lease", func() error {
			l, err := sa.CoordinationV1().Leases(systemNamespace).Get(ctx, leaderLease, metav1.GetOptions{})
			if err != nil {
				return err
			}
			holder := "replica-1"
			l.Spec.HolderIdentity = &holder
			_, err = sa.CoordinationV1().Leases(systemNamespace).Update(ctx, l, metav1.UpdateOptions{})
			return err
		}},
		{"create a TokenReview", func() error {
			_, err := sa.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
				Spec: authenticationv1.TokenReviewSpec{Token: "garbage"},
			}, metav1.CreateOptions{})
			return err
		}},
	}
	for _, a := range allowed {
		assert.NoError(t, a.do(), "allowed: %s", a.name)
	}

	denied := []struct {
		name string
		do   func() error
	}{
		{"get another Secret in its namespace", func() error { _, err := secrets.Get(ctx, "not-trustbridge", metav1.GetOptions{}); return err }},
		{"list Secrets", func() error { _, err := secrets.List(ctx, metav1.ListOptions{}); return err }},
		{"delete the CA Secret", func() error { return secrets.Delete(ctx, caSecret, metav1.DeleteOptions{}) }},
		{"get a Secret elsewhere", func() error {
			_, err := sa.CoreV1().Secrets(other).Get(ctx, caSecret, metav1.GetOptions{})
			return err
		}},
		{"create a Secret elsewhere", func() error {
			_, err := sa.CoreV1().Secrets(other).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
			return err
		}},
		{"get another ConfigMap elsewhere", func() error {
			_, err := sa.CoreV1().ConfigMaps(other).Get(ctx, "app-config", metav1.GetOptions{})
			return err
		}},
		{"update another ConfigMap elsewhere", func() error {
			_, err := sa.CoreV1().ConfigMaps(other).Update(ctx, configMap(other, "app-config", nil, map[string]string{"k": "evil"}), metav1.UpdateOptions{})
			return err
		}},
		{"delete another ConfigMap elsewhere", func() error {
			return sa.CoreV1().ConfigMaps(other).Delete(ctx, "app-config", metav1.DeleteOptions{})
		}},
		{"list all ConfigMaps", func() error { _, err := sa.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{}); return err }},
		{"get another Lease", func() error {
			_, err := sa.CoordinationV1().Leases(systemNamespace).Get(ctx, "someone-elses-lease", metav1.GetOptions{})
			return err
		}},
		{"delete a namespace", func() error { return sa.CoreV1().Namespaces().Delete(ctx, other, metav1.DeleteOptions{}) }},
		{"delete a pod", func() error { return sa.CoreV1().Pods(other).Delete(ctx, "any", metav1.DeleteOptions{}) }},
		// Nothing in trustbridge records Events.
		{"create an Event", func() error {
			_, err := sa.CoreV1().Events(systemNamespace).Create(ctx, &corev1.Event{
				ObjectMeta:     metav1.ObjectMeta{GenerateName: "trustbridge-"},
				InvolvedObject: corev1.ObjectReference{Kind: "Lease", Namespace: systemNamespace, Name: leaderLease},
				Reason:         "LeaderElection", Message: "test", Type: corev1.EventTypeNormal,
			}, metav1.CreateOptions{})
			return err
		}},
	}
	for _, d := range denied {
		err := d.do()
		assert.True(t, apierrors.IsForbidden(err), "denied: %s: got %v", d.name, err)
	}

	// RBAC cannot pin create to a name; the admission policy of
	// deploy/rbac does. It takes effect once the API server has loaded it,
	// so the first creates may still pass: each probe uses a fresh name.
	t.Run("create pinned by the admission policy", func(t *testing.T) {
		var last error
		refused := assert.Eventually(t, func() bool {
			name := randomName("app-config-")
			_, last = sa.CoreV1().ConfigMaps(other).Create(ctx, configMap(other, name, nil, map[string]string{"k": "v"}), metav1.CreateOptions{})
			return apierrors.IsForbidden(last)
		}, waitFor, tick)
		require.True(t, refused, "create of another ConfigMap elsewhere: last got %v", last)
		assert.ErrorContains(t, last, "trustbridge may write only its trust ConfigMap")
		// What trustbridge does create still goes through.
		_, err := sa.CoreV1().ConfigMaps(other).Create(ctx, configMap(other, DefaultName, nil, nil), metav1.CreateOptions{})
		assert.NoError(t, err, "the trust ConfigMap")
		_, err = sa.CoreV1().ConfigMaps(systemNamespace).Create(ctx,
			configMap(systemNamespace, randomName(kubelkg.DefaultPrefix), nil, nil), metav1.CreateOptions{})
		assert.NoError(t, err, "a federated last-known-good ConfigMap in its namespace")
		_, err = env.Client.CoreV1().ConfigMaps(other).Create(ctx, configMap(other, randomName("admin-"), nil, nil), metav1.CreateOptions{})
		assert.NoError(t, err, "other users are not affected")
	})

	// RBAC has no name prefixes, so the Role lets trustbridge write any
	// ConfigMap of its namespace; the policy (loaded by now: the subtest
	// above saw it refuse) keeps it to its federated bundles there, never
	// its own config.
	t.Run("writes in its namespace pinned by the admission policy", func(t *testing.T) {
		cms := sa.CoreV1().ConfigMaps(systemNamespace)
		own, err := env.Client.CoreV1().ConfigMaps(systemNamespace).Create(ctx,
			configMap(systemNamespace, randomName("trustbridge-config-"), nil, map[string]string{"config.yaml": "trust-domain: example.org\n"}), metav1.CreateOptions{})
		require.NoError(t, err)
		own.Data["config.yaml"] = "trust-domain: evil.example\n"
		_, err = cms.Update(ctx, own, metav1.UpdateOptions{})
		assert.True(t, apierrors.IsForbidden(err), "update its own config: got %v", err)
		assert.ErrorContains(t, err, "trustbridge may write only its trust ConfigMap")
		err = cms.Delete(ctx, own.Name, metav1.DeleteOptions{})
		assert.True(t, apierrors.IsForbidden(err), "delete its own config: got %v", err)
		_, err = cms.Create(ctx, configMap(systemNamespace, randomName("trustbridge-config-"), nil, nil), metav1.CreateOptions{})
		assert.True(t, apierrors.IsForbidden(err), "create a ConfigMap not of its federated bundles: got %v", err)

		lkg, err := cms.Create(ctx, configMap(systemNamespace, randomName(kubelkg.DefaultPrefix), nil, map[string]string{"entry.json": "{}"}), metav1.CreateOptions{})
		require.NoError(t, err, "a federated last-known-good ConfigMap")
		lkg.Data["entry.json"] = `{"sequence": 2}`
		_, err = cms.Update(ctx, lkg, metav1.UpdateOptions{})
		assert.NoError(t, err, "update a federated last-known-good ConfigMap")
		assert.NoError(t, cms.Delete(ctx, lkg.Name, metav1.DeleteOptions{}), "delete a federated last-known-good ConfigMap")
	})
}
