package kubetest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// TestSharedServer checks what the other packages' tests rely on: a
// namespace of their own, Secrets with optimistic concurrency, and service
// account tokens the API server itself reviews.
func TestSharedServer(t *testing.T) {
	env := Shared(t)
	ns := env.Namespace(t)
	ctx := context.Background()

	s, err := env.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "s"}, Data: map[string][]byte{"k": []byte("v1")},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	stale := s.DeepCopy()
	s.Data["k"] = []byte("v2")
	_, err = env.Client.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{})
	require.NoError(t, err)
	stale.Data["k"] = []byte("v3")
	_, err = env.Client.CoreV1().Secrets(ns).Update(ctx, stale, metav1.UpdateOptions{})
	assert.Error(t, err, "an update on an old resourceVersion must conflict")

	tok := env.ServiceAccountToken(t, ns, "workload", []string{"example.org"}, 10*time.Minute)
	tr, err := env.Client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: tok, Audiences: []string{"example.org"}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	assert.True(t, tr.Status.Authenticated, tr.Status.Error)
	assert.Equal(t, "system:serviceaccount:"+ns+":workload", tr.Status.User.Username)

	tr, err = env.Client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: tok, Audiences: []string{"other.example"}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	assert.False(t, tr.Status.Authenticated, "a token for another audience must not authenticate")
}
