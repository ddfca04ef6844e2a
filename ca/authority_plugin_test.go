package ca

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func pluginAuthority(t *testing.T, clk *clocktesting.FakeClock, pluginDir, dataDir string) (*Authority, error) {
	t.Helper()
	w := NewPluginWatcher(pluginDir, tdExample, clk, time.Second, nil)
	return New(Config{
		TrustDomain: tdExample, DataDir: dataDir, Clock: clk, Registerer: prometheus.NewRegistry(),
		RefreshHint: time.Minute, WorkloadTTL: time.Hour, MaxWorkloadTTL: 2 * time.Hour, Plugin: w,
	})
}

func TestAuthorityPluginMode(t *testing.T) {
	// Real time: go-spiffe's ParseAndVerify checks validity against it.
	now := time.Now()
	clk := clocktesting.NewFakeClock(now)
	pluginDir, dataDir := t.TempDir(), t.TempDir()
	pki := newPluginPKI(t, pluginPKIOptions{now: now, midType: testca.ECP256})
	writePluginDir(t, pluginDir, pki.files(t, true))

	a, err := pluginAuthority(t, clk, pluginDir, dataDir)
	require.NoError(t, err)
	require.NoError(t, a.Ready())
	assert.Equal(t, uint64(now.Unix()), a.Sequence(), "the first sequence is the time")
	require.Len(t, a.Bundle().X509Authorities(), 1)
	assert.True(t, pki.root.Cert.Equal(a.Bundle().X509Authorities()[0]), "the bundle holds root-cert.pem")
	assert.Equal(t, castate.StateExternal, a.Roots()[0].State)
	assert.ErrorContains(t, a.Rotate(), "managed outside trustbridge")

	id := spiffeid.RequireFromPath(tdExample, "/w")
	res, err := a.Sign(workloadCSR(t, id), id, 0)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(res.Chain), 3, "leaf, signing CA, middle intermediate")
	raw := make([][]byte, 0, len(res.Chain))
	for _, c := range res.Chain {
		raw = append(raw, c.Raw)
	}
	got, _, err := x509svid.ParseAndVerify(raw, x509bundle.FromX509Authorities(tdExample, a.Bundle().X509Authorities()))
	require.NoError(t, err)
	assert.Equal(t, id, got)

	// A restart with the same roots publishes them under a new sequence
	// (the state could be a restored copy), here in the same second.
	b, err := pluginAuthority(t, clk, pluginDir, dataDir)
	require.NoError(t, err)
	assert.Equal(t, a.Sequence()+1, b.Sequence())
	seq := b.Sequence()

	// A broken change: not ready, the error is visible, the last good
	// material keeps signing.
	require.NoError(t, os.WriteFile(filepath.Join(pluginDir, pluginKeyFile), pemPKCS8(t, testca.NewKey(t, testca.ECP256)), 0o600))
	require.Error(t, b.cfg.Plugin.Check())
	require.Error(t, b.Ready())
	assert.Contains(t, b.Ready().Error(), "still signing with the last good material")
	_, err = b.Sign(workloadCSR(t, id), id, 0)
	require.NoError(t, err)
	assert.Equal(t, seq, b.Sequence())

	// A valid new CA with a new root: published with the next sequence.
	pki2 := newPluginPKI(t, pluginPKIOptions{now: now})
	writePluginDir(t, pluginDir, pki2.files(t, false))
	require.NoError(t, b.cfg.Plugin.Check())
	require.NoError(t, b.manager.syncPlugin())
	require.NoError(t, b.Ready())
	assert.Equal(t, seq+1, b.Sequence())
	published := b.Bundle().X509Authorities()
	require.Len(t, published, 2, "the old root stays published while leaves it signed are valid")
	assert.True(t, pki2.root.Cert.Equal(published[0]))
	assert.True(t, pki.root.Cert.Equal(published[1]))

	// A restart still knows the retired root.
	c, err := pluginAuthority(t, clk, pluginDir, dataDir)
	require.NoError(t, err)
	assert.Len(t, c.Bundle().X509Authorities(), 2)
	assert.Equal(t, seq+2, c.Sequence())

	// After the maximum workload TTL it leaves, with a sequence step.
	clk.SetTime(now.Add(2*time.Hour + retireMargin + time.Second))
	require.NoError(t, c.manager.syncPlugin())
	require.Len(t, c.Bundle().X509Authorities(), 1)
	assert.Equal(t, uint64(clk.Now().Unix()), c.Sequence(), "hours later: the time")
}

func TestAuthorityRefusesModeSwitch(t *testing.T) {
	clk := clocktesting.NewFakeClock(pluginT0)
	pluginDir := t.TempDir()
	writePluginDir(t, pluginDir, newPluginPKI(t, pluginPKIOptions{}).files(t, false))

	t.Run("self-signed data dir, then plug-in", func(t *testing.T) {
		cfg := testConfig(t, clk)
		_, err := New(cfg)
		require.NoError(t, err)
		_, err = pluginAuthority(t, clk, pluginDir, cfg.DataDir)
		assert.ErrorContains(t, err, "holds self-signed roots")
	})
	t.Run("plug-in data dir, then self-signed", func(t *testing.T) {
		dataDir := t.TempDir()
		_, err := pluginAuthority(t, clk, pluginDir, dataDir)
		require.NoError(t, err)
		cfg := testConfig(t, clk)
		cfg.DataDir = dataDir
		_, err = New(cfg)
		assert.ErrorContains(t, err, "was used with a plug-in CA")
	})
}

func TestAuthorityPluginInvalidAtStart(t *testing.T) {
	clk := clocktesting.NewFakeClock(pluginT0)
	pluginDir := t.TempDir()
	files := newPluginPKI(t, pluginPKIOptions{}).files(t, false)
	delete(files, pluginRootFile)
	writePluginDir(t, pluginDir, files)
	_, err := pluginAuthority(t, clk, pluginDir, t.TempDir())
	assert.ErrorContains(t, err, "root-cert.pem")
}
