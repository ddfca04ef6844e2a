package distribution

import (
	"bytes"
	"context"
	"crypto/x509"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	pkcs12 "software.sslmate.com/src/go-pkcs12"
)

var (
	testLabels      = map[string]string{"team.example/owner": "platform"}
	testAnnotations = map[string]string{"example.com/source": "trustbridge federation"}
)

// newSecretRig is a rig of a Secret controller with a truststore sealed
// under password, and the test labels and annotations.
func newSecretRig(t *testing.T, client kubernetes.Interface, name, password string) *kubeRig {
	t.Helper()
	return newKubeRigWith(t, client, name, func(c *Config) {
		c.Kind = KindSecret
		c.Truststore = Truststore{Enabled: true, Password: password}
		c.Labels, c.Annotations = testLabels, testAnnotations
	})
}

func (r *kubeRig) getSecret(ns string) (*corev1.Secret, error) {
	return r.env.Client.CoreV1().Secrets(ns).Get(context.Background(), r.name, metav1.GetOptions{})
}

// secretCurrent reports whether s is ours, Opaque, labelled and annotated,
// and holds the current rendering and a truststore of exactly the local
// roots.
func (r *kubeRig) secretCurrent(s *corev1.Secret, want map[string]string, roots []*x509.Certificate) bool {
	if s.Type != corev1.SecretTypeOpaque || s.Labels[ManagedByLabel] != ManagedByValue ||
		!hasAll(s.Labels, testLabels) || !hasAll(s.Annotations, testAnnotations) || len(s.Data) != len(want)+1 {
		return false
	}
	for k, v := range want {
		if string(s.Data[k]) != v {
			return false
		}
	}
	certs, err := pkcs12.DecodeTrustStore(s.Data[KeyTruststore], r.ctrl.cfg.Truststore.Password)
	return err == nil && len(certs) == len(roots) && equalCerts(certs, roots)
}

func equalCerts(a, b []*x509.Certificate) bool {
	for i := range a {
		if !bytes.Equal(a[i].Raw, b[i].Raw) {
			return false
		}
	}
	return true
}

func (r *kubeRig) waitSecretCurrent(t *testing.T, namespaces ...string) {
	t.Helper()
	want := r.want(t)
	local, ok := r.store.Snapshot().Bundle(r.ctrl.cfg.TrustDomain)
	require.True(t, ok)
	for _, ns := range namespaces {
		require.Eventually(t, func() bool {
			s, err := r.getSecret(ns)
			return err == nil && r.secretCurrent(s, want, local.X509Authorities())
		}, waitFor, tick, "namespace %s never got the current Secret", ns)
	}
}

func (r *kubeRig) waitSecretGone(t *testing.T, ns string) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := r.getSecret(ns)
		return apierrors.IsNotFound(err)
	}, waitFor, tick, "Secret in namespace %s never went away", ns)
}

// TestKubeSecretTarget: the Secret target follows the namespace selector
// and the trust store like the ConfigMap, its truststore holds exactly the
// local roots (never a federated one), and edits are undone.
func TestKubeSecretTarget(t *testing.T) {
	t.Parallel()
	r := newSecretRig(t, nil, "", "changeit")
	r.store.Set("federation", newPeerBundle(t))
	selected := r.namespace(t, true)
	unselected := r.namespace(t, false)
	r.start(t)
	r.waitSecretCurrent(t, selected)
	_, err := r.getSecret(unselected)
	assert.True(t, apierrors.IsNotFound(err), "unselected namespace has no Secret: %v", err)
	_, err = r.get(selected)
	assert.True(t, apierrors.IsNotFound(err), "a Secret controller writes no ConfigMap: %v", err)
	ctx := context.Background()

	t.Run("namespace relabelled to match", func(t *testing.T) {
		r.setSelected(t, unselected, true)
		r.waitSecretCurrent(t, unselected)
	})
	t.Run("root rotation", func(t *testing.T) {
		local := r.cas[localTD]
		b := local.Bundle()
		b.AddX509Authority(newPeerBundle(t).X509Authorities()[0])
		r.store.Set("ca", b)
		r.waitSecretCurrent(t, selected, unselected)
	})
	t.Run("edits undone", func(t *testing.T) {
		s, err := r.getSecret(selected)
		require.NoError(t, err)
		s.Data[KeyTruststore] = []byte("not a truststore")
		delete(s.Labels, "team.example/owner")
		_, err = r.env.Client.CoreV1().Secrets(selected).Update(ctx, s, metav1.UpdateOptions{})
		require.NoError(t, err)
		r.waitSecretCurrent(t, selected)
	})
	t.Run("deleted", func(t *testing.T) {
		require.NoError(t, r.env.Client.CoreV1().Secrets(selected).Delete(ctx, r.name, metav1.DeleteOptions{}))
		r.waitSecretCurrent(t, selected)
	})
	t.Run("namespace relabelled to no longer match", func(t *testing.T) {
		r.setSelected(t, selected, false)
		r.waitSecretGone(t, selected)
	})
	t.Run("foreign Secret left alone", func(t *testing.T) {
		ns := r.env.Namespace(t)
		_, err := r.env.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: r.name}, StringData: map[string]string{"k": "v"},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		r.setSelected(t, ns, true)
		require.Eventually(t, func() bool {
			return metricValue(t, r.reg, "trustbridge_distribution_namespaces", map[string]string{"state": stateForeign}) == 1
		}, waitFor, tick)
		s, err := r.getSecret(ns)
		require.NoError(t, err)
		assert.Equal(t, map[string][]byte{"k": []byte("v")}, s.Data)
	})
}

// TestKubeConfigMapTruststore: the ConfigMap target carries the
// passwordless truststore in binaryData, labels and annotations, and a
// restart (a new leadership term) does not rewrite a truststore that
// holds the right roots under other salts.
func TestKubeConfigMapTruststore(t *testing.T) {
	t.Parallel()
	r := newKubeRigWith(t, nil, "", func(c *Config) {
		c.Truststore = Truststore{Enabled: true}
		c.Labels, c.Annotations = testLabels, testAnnotations
	})
	ns := r.namespace(t, true)
	stop := startController(t, r.ctrl)
	local, _ := r.store.Snapshot().Bundle(r.ctrl.cfg.TrustDomain)
	want := r.want(t)
	var first *corev1.ConfigMap
	require.Eventually(t, func() bool {
		cm, err := r.get(ns)
		if err != nil || !assert.ObjectsAreEqual(want, cm.Data) || !hasAll(cm.Labels, testLabels) || !hasAll(cm.Annotations, testAnnotations) {
			return false
		}
		certs, err := pkcs12.DecodeTrustStore(cm.BinaryData[KeyTruststore], "")
		first = cm
		return err == nil && len(cm.BinaryData) == 1 && len(certs) == len(local.X509Authorities()) && equalCerts(certs, local.X509Authorities())
	}, waitFor, tick)
	assert.Equal(t, ManagedByValue, first.Labels[ManagedByLabel])

	stop()
	startController(t, r.ctrl)
	require.Eventually(t, func() bool { return r.ctrl.Ready() == nil }, waitFor, tick)
	require.Eventually(t, func() bool {
		return metricValue(t, r.reg, "trustbridge_distribution_namespaces", map[string]string{"state": stateCurrent}) == 1
	}, waitFor, tick)
	cm, err := r.get(ns)
	require.NoError(t, err)
	assert.Equal(t, first.ResourceVersion, cm.ResourceVersion, "a truststore holding the right roots is not rewritten")
}
