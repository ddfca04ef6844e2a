package authn

import (
	"context"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// TestServiceAccountGrantsRealAPIServer follows a service account through
// a real kube-apiserver: the UID TokenReview reports is the one grants
// record, a deletion revokes, and a re-created account of the same name
// does not inherit the old grant.
func TestServiceAccountGrantsRealAPIServer(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	webID := spiffeid.RequireFromString("spiffe://example.org/ns/" + ns + "/sa/web")

	// The grant of a first issuance, as TokenReview reports it.
	tr, err := NewTokenReview(TokenReviewConfig{Client: env.Client, TrustDomain: localTD})
	require.NoError(t, err)
	ident, err := tr.Authenticate(ctx, Request{BearerToken: env.ServiceAccountToken(t, ns, "web", []string{"example.org"}, time.Hour)})
	require.NoError(t, err)
	sa, err := env.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "web", metav1.GetOptions{})
	require.NoError(t, err)
	require.NotNil(t, ident.Grant)
	assert.Equal(t, Grant{Method: MethodKubernetesJWT, Ref: ns + "/web", UID: string(sa.UID)}, *ident.Grant)
	grant := *ident.Grant
	grant.GrantedAt = time.Now()

	s, err := NewServiceAccountGrants(ServiceAccountGrantsConfig{Client: env.Client})
	require.NoError(t, err)
	deleted := make(chan struct{}, 1)
	_, err = s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(obj any) {
		if a, ok := obj.(*corev1.ServiceAccount); ok && a.Namespace == ns {
			deleted <- struct{}{}
		}
	}})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	require.True(t, cache.WaitForCacheSync(t.Context().Done(), s.HasSynced))
	require.NoError(t, s.CheckGrant(ctx, webID, grant))

	require.NoError(t, env.Client.CoreV1().ServiceAccounts(ns).Delete(ctx, "web", metav1.DeleteOptions{}))
	<-deleted
	err = s.CheckGrant(ctx, webID, grant)
	require.ErrorIs(t, err, ErrGrantRevoked)
	assert.Contains(t, err.Error(), "was deleted")

	// Same name, new account: the old chain stays revoked, even before the
	// informer hears of it. The deletion the API server confirmed for that
	// UID is remembered (UIDs are never reused), so no new confirmation is
	// spent on it.
	_, err = env.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "web"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	err = s.CheckGrant(ctx, webID, grant)
	require.ErrorIs(t, err, ErrGrantRevoked)
	assert.Contains(t, err.Error(), "was deleted")
}
