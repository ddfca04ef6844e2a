package authn

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// replicaLedger is one replica's ledger on the shared Secret, with a
// client of its own, as two pods have.
func replicaLedger(t *testing.T, env *kubetest.Env, ns string) *KubeLedger {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	require.NoError(t, err)
	l, err := NewKubeLedger(KubeLedgerConfig{Client: cs, Namespace: ns})
	require.NoError(t, err)
	return l
}

// TestKubeLedger runs against a real API server: the first consumption
// creates the Secret (Opaque, labelled, references only), a second one is
// refused on this replica and on another, and a new replica (a restart)
// still sees it.
func TestKubeLedger(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	a, b := replicaLedger(t, env, ns), replicaLedger(t, env, ns)

	c := consumption(tokLaptop, laptopID)
	_, ok, err := a.Consumed(ctx, c.Ref)
	require.NoError(t, err, "no Secret yet: nothing consumed")
	assert.False(t, ok)
	require.NoError(t, a.Consume(ctx, c))
	require.ErrorIs(t, a.Consume(ctx, c), ErrTokenConsumed)
	require.ErrorIs(t, b.Consume(ctx, c), ErrTokenConsumed, "the other replica agrees")
	got, ok, err := b.Consumed(ctx, c.Ref)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, c, got)

	restarted := replicaLedger(t, env, ns)
	_, ok, err = restarted.Consumed(ctx, c.Ref)
	require.NoError(t, err)
	assert.True(t, ok, "consumption survives a restart")

	sec, err := env.Client.CoreV1().Secrets(ns).Get(ctx, DefaultLedgerSecret, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, corev1.SecretTypeOpaque, sec.Type)
	assert.Equal(t, "trustbridge", sec.Labels["app.kubernetes.io/managed-by"])
	assert.Len(t, sec.Data, 1)
	for k, v := range sec.Data {
		assert.Equal(t, c.Ref, k)
		assert.NotContains(t, string(v), tokLaptop)
	}
	assert.Equal(t, "Secret "+ns+"/"+DefaultLedgerSecret, a.Describe())
}

// TestKubeLedgerRace: replicas consuming one token at once, each with
// its own client: exactly one wins, whether the Secret exists yet
// (AlreadyExists on create) or not (Conflict on update); and consumptions
// of different tokens racing on the one Secret all land (the losers of
// each Conflict read again and retry).
func TestKubeLedgerRace(t *testing.T) {
	env := kubetest.Shared(t)
	for _, exists := range []bool{false, true} {
		t.Run(fmt.Sprintf("secret exists %v", exists), func(t *testing.T) {
			ns := env.Namespace(t)
			ctx := context.Background()
			const n = 6
			replicas := make([]*KubeLedger, n)
			for i := range replicas {
				replicas[i] = replicaLedger(t, env, ns)
			}
			if exists {
				require.NoError(t, replicas[0].Consume(ctx, consumption(tokVM2, vmID)))
			}
			c := consumption(tokLaptop, laptopID)
			exactlyOneConsumes(t, n, func(i int) error { return replicas[i].Consume(ctx, c) }, "replica")
		})
	}

	t.Run("different tokens", func(t *testing.T) {
		ns := env.Namespace(t)
		ctx := context.Background()
		const n = 8
		refs := make([]string, n)
		var wg sync.WaitGroup
		for i := range n {
			r := replicaLedger(t, env, ns)
			c := consumption(fmt.Sprintf("token-%02d-0123456789abcdef", i), laptopID)
			refs[i] = c.Ref
			wg.Go(func() { assert.NoError(t, r.Consume(ctx, c)) })
		}
		wg.Wait()
		sec, err := env.Client.CoreV1().Secrets(ns).Get(ctx, DefaultLedgerSecret, metav1.GetOptions{})
		require.NoError(t, err)
		for _, ref := range refs {
			assert.Contains(t, sec.Data, ref)
		}
	})
}

// TestKubeLedgerForeignSecret: a Secret of another type under the name is
// not taken for a ledger, and a hand-edited entry still counts as
// consumed.
func TestKubeLedgerForeignSecret(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	c := consumption(tokLaptop, laptopID)
	_, err := env.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "tls", Namespace: ns},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{"tls.crt": []byte("x"), "tls.key": []byte("y")},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	l, err := NewKubeLedger(KubeLedgerConfig{Client: env.Client, Namespace: ns, Name: "tls"})
	require.NoError(t, err)
	_, _, err = l.Consumed(ctx, c.Ref)
	require.ErrorContains(t, err, "not a ledger trustbridge wrote")
	require.ErrorContains(t, l.Consume(ctx, c), "not a ledger trustbridge wrote")

	_, err = env.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultLedgerSecret, Namespace: ns},
		Data:       map[string][]byte{c.Ref: []byte("edited by hand")},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	l = replicaLedger(t, env, ns)
	got, ok, err := l.Consumed(ctx, c.Ref)
	require.NoError(t, err)
	assert.True(t, ok, "a record that does not parse still says the token was spent")
	assert.Equal(t, c.Ref, got.Ref)
	require.ErrorIs(t, l.Consume(ctx, c), ErrTokenConsumed)
}

// TestBootstrapTokensKubeReplicas: two servers' authenticators sharing the
// Secret; a token one of them spent is refused by the other.
func TestBootstrapTokensKubeReplicas(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	one := newUseFixture(t, replicaLedger(t, env, ns))
	two := loadUseFixture(t, one.path, replicaLedger(t, env, ns))

	id1, err := one.b.Authenticate(ctx, Request{BearerToken: tokLaptop})
	require.NoError(t, err)
	id2, err := two.b.Authenticate(ctx, Request{BearerToken: tokLaptop})
	require.NoError(t, err, "neither has spent it yet")
	require.NoError(t, id1.Spend(ctx))
	err = id2.Spend(ctx)
	require.ErrorIs(t, err, ErrTokenConsumed)
	assert.Equal(t, 1.0, two.consumptions("already_consumed"))
	_, err = two.b.Authenticate(ctx, Request{BearerToken: tokLaptop})
	require.ErrorIs(t, err, ErrTokenConsumed)
	assert.True(t, strings.Contains(err.Error(), "consumed at "), err.Error())
}

// TestKubeLedgerFull: a Secret that cannot take another entry refuses the
// consumption with an error saying what to do; the token is not recorded.
func TestKubeLedgerFull(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	filler := consumption(tokVM, vmID)
	_, err := env.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultLedgerSecret, Namespace: ns},
		Data:       map[string][]byte{filler.Ref: []byte(strings.Repeat("x", maxLedgerSecretSize-40))},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	l := replicaLedger(t, env, ns)
	c := consumption(tokLaptop, laptopID)
	err = l.Consume(ctx, c)
	require.ErrorContains(t, err, "consumed tokens fill the Secret")
	assert.NotErrorIs(t, err, ErrTokenConsumed)
	_, ok, err := replicaLedger(t, env, ns).Consumed(ctx, c.Ref)
	require.NoError(t, err)
	assert.False(t, ok)
}
