package kubestore

import (
	"context"
	"path"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// TestMoveFileStateIntoASecret is docs/operations.md's move from --storage
// file to --storage kube: a Secret made from ca/state.json and the files
// of ca/roots, each under its base name (what `kubectl create secret
// generic --from-file=state.json=... --from-file=DIR/ca/roots/` does), is
// the same CA, and the first leader publishes it above every sequence the
// file store published.
func TestMoveFileStateIntoASecret(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	clk := clocktesting.NewFakeClock(t0)
	cfg := authorityConfig(clk, nil, nil)
	cfg.Backend, cfg.DataDir = nil, t.TempDir()
	file, err := ca.New(cfg)
	require.NoError(t, err)
	require.NoError(t, prepareRoot(file))
	published := file.Sequence()

	_, files, err := ca.Snapshot(cfg.DataDir)
	require.NoError(t, err)
	data := map[string][]byte{}
	for _, f := range files {
		data[path.Base(f.Name)] = f.Data
	}
	_, err = env.Client.CoreV1().Secrets(ns).Create(context.Background(),
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: DefaultName}, Data: data}, metav1.CreateOptions{})
	require.NoError(t, err)

	clk.Step(time.Minute)
	kube := newAuthority(t, clk, newStore(t, env.Client, ns, nil), nil)
	assert.Equal(t, serials(file), serials(kube), "the same roots")
	assert.Greater(t, kube.Sequence(), published)
	assert.Equal(t, uint64(clk.Now().Unix()), kube.Sequence())
	assert.Equal(t, kube.Sequence(), journalOf(t, secret(t, env.Client, ns)).Sequence, "written to the Secret")
}
