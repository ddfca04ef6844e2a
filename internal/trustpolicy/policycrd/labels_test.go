package policycrd

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	k8sfake "k8s.io/client-go/kubernetes/fake"
)

func serviceAccount(ns, name string, labels map[string]string) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels,
		Annotations: map[string]string{"kept": "no"}, UID: types.UID("u-" + name)}, Secrets: []corev1.ObjectReference{{Name: "s"}}}
}

// runLabels runs a ServiceAccountLabels on client until the test ends.
func runLabels(t *testing.T, client kubernetes.Interface) *ServiceAccountLabels {
	t.Helper()
	s, err := NewServiceAccountLabels(client, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return s
}

// waitChanged waits for ch to close, which is how SDS streams learn of it.
func waitChanged(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("Changed never closed after %s", what)
	}
}

func TestServiceAccountLabels(t *testing.T) {
	client := k8sfake.NewClientset(serviceAccount("payments", "api", map[string]string{"tier": "api"}), serviceAccount("payments", "bare", nil))
	s := runLabels(t, client)
	require.Eventually(t, s.HasSynced, 30*time.Second, 10*time.Millisecond)

	assert.Equal(t, map[string]string{"tier": "api"}, s.Labels("payments", "api"))
	assert.Equal(t, map[string]string{}, s.Labels("payments", "bare"), "known, without labels: not nil, so DoesNotExist matches")
	assert.Nil(t, s.Labels("payments", "ghost"), "unknown")
	assert.Nil(t, s.Labels("", "api"))
	got := s.Labels("payments", "api")
	got["tier"] = "changed"
	assert.Equal(t, map[string]string{"tier": "api"}, s.Labels("payments", "api"), "the caller's copy")

	// Only names and labels are kept.
	obj, exists, err := s.informer.GetIndexer().GetByKey("payments/api")
	require.NoError(t, err)
	require.True(t, exists)
	assert.Equal(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "payments", Name: "api", Labels: map[string]string{"tier": "api"}}},
		obj.(*corev1.ServiceAccount))

	ch := s.Changed()
	sa := serviceAccount("payments", "api", map[string]string{"tier": "web"})
	_, err = client.CoreV1().ServiceAccounts("payments").Update(context.Background(), sa, metav1.UpdateOptions{})
	require.NoError(t, err)
	waitChanged(t, ch, "a relabel")
	assert.Equal(t, map[string]string{"tier": "web"}, s.Labels("payments", "api"))

	ch = s.Changed()
	require.NoError(t, client.CoreV1().ServiceAccounts("payments").Delete(context.Background(), "api", metav1.DeleteOptions{}))
	waitChanged(t, ch, "a deletion")
	assert.Nil(t, s.Labels("payments", "api"))

	ch = s.Changed()
	_, err = client.CoreV1().ServiceAccounts("billing").Create(context.Background(), serviceAccount("billing", "new", nil), metav1.CreateOptions{})
	require.NoError(t, err)
	waitChanged(t, ch, "a creation")
	assert.Equal(t, map[string]string{}, s.Labels("billing", "new"))
}

func TestLabelsChanged(t *testing.T) {
	a := serviceAccount("ns", "a", map[string]string{"k": "v"})
	annotated := a.DeepCopy()
	annotated.Annotations["other"] = "x"
	relabelled := a.DeepCopy()
	relabelled.Labels["k"] = "w"
	unlabelled := a.DeepCopy()
	unlabelled.Labels = nil
	tests := []struct {
		name     string
		old, cur any
		want     bool
	}{
		{"resync", a, a, false},
		{"annotation", a, annotated, false},
		{"relabel", a, relabelled, true},
		{"labels removed", a, unlabelled, true},
		{"not a service account", "x", a, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, labelsChanged(tt.old, tt.cur))
		})
	}
}
