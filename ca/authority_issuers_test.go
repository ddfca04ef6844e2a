package ca

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// signLeafWithIssuer signs a workload leaf and returns it with its issuer, the
// certificate of the chain whose key signed it (in self-signed mode the
// chain ends with every published root, in journal order).
func signLeafWithIssuer(t *testing.T, a *Authority) (*Issued, *x509.Certificate) {
	t.Helper()
	id := spiffeid.RequireFromPath(tdExample, "/w")
	issued, err := a.Sign(workloadCSR(t, id), id, 0)
	require.NoError(t, err)
	for _, c := range issued.Chain[1:] {
		if issued.Leaf.CheckSignatureFrom(c) == nil {
			return issued, c
		}
	}
	t.Fatal("no certificate of the chain signed the leaf")
	return nil, nil
}

// issuerOf is the issuer of a leaf a signs now.
func issuerOf(t *testing.T, a *Authority) *x509.Certificate {
	t.Helper()
	_, issuer := signLeafWithIssuer(t, a)
	return issuer
}

// TestIssuedHereSelfSigned: the active root, a prepared one and, after a
// rotation, the retired one are ours until they leave the bundle; another
// CA of the trust domain and nil are not.
func TestIssuedHereSelfSigned(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	a, err := New(testConfig(t, clk))
	require.NoError(t, err)
	first := issuerOf(t, a)
	assert.True(t, a.IssuedHere(first))
	assert.False(t, a.IssuedHere(nil))
	assert.False(t, a.IssuedHere(testca.New(t, "example.org").Cert), "another CA of the trust domain")

	require.NoError(t, a.Rotate())
	require.Len(t, a.Roots(), 2)
	prepared := a.Roots()[1]
	require.Equal(t, castate.StatePrepared, prepared.State)
	assert.True(t, a.IssuedHere(prepared.Cert),
		"a prepared root: its key is ours, and a leader whose state is ahead of ours may already sign with it")

	require.NoError(t, a.Reconcile()) // publishes it: its lead starts
	clk.Step(PublishLead*a.cfg.RefreshHint + time.Second)
	require.NoError(t, a.Reconcile())
	require.Equal(t, castate.StateRetired, a.Roots()[0].State)
	second := issuerOf(t, a)
	require.False(t, second.Equal(first))
	assert.True(t, a.IssuedHere(second), "the new active root")
	assert.True(t, a.IssuedHere(first), "the retired root, whose leaves may still be valid")

	clk.Step(a.cfg.MaxWorkloadTTL + 2*retireMargin)
	require.NoError(t, a.Reconcile())
	require.Len(t, a.Roots(), 1)
	assert.False(t, a.IssuedHere(first), "removed once every leaf it signed expired")
	assert.True(t, a.IssuedHere(second))
}

// TestIssuedHereUpstream: our intermediate and, after its renewal, the
// retired one are ours; the upstream's own certificates never are, though
// they anchor our chain.
func TestIssuedHereUpstream(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(t, clk)
	a, err := New(upstreamConfig(t, clk, u))
	require.NoError(t, err)
	issued, first := signLeafWithIssuer(t, a)
	require.True(t, first.Equal(issued.Chain[1]))
	assert.True(t, a.IssuedHere(first))
	for _, c := range issued.Chain[2:] {
		assert.False(t, a.IssuedHere(c), "the upstream's %s", c.Subject)
	}
	assert.False(t, a.IssuedHere(u.root))

	clk.Step(25 * time.Hour) // past half the intermediate's life
	require.NoError(t, a.Reconcile())
	require.Len(t, a.Roots(), 2)
	second := issuerOf(t, a)
	require.False(t, second.Equal(first))
	assert.True(t, a.IssuedHere(second))
	assert.True(t, a.IssuedHere(first), "the retired intermediate, whose leaves may still be valid")

	clk.Step(a.cfg.MaxWorkloadTTL + 2*retireMargin)
	require.NoError(t, a.Reconcile())
	require.Len(t, a.Roots(), 1)
	assert.False(t, a.IssuedHere(first))
	assert.True(t, a.IssuedHere(second))
}

// TestIssuedHereUpstreamPrepared: an intermediate prepared while its new
// upstream root is published is ours, as the leader that activated it
// before our state caught up may sign with it; the new upstream root is not.
func TestIssuedHereUpstreamPrepared(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	u := newFakeUpstream(t, clk)
	a, err := New(upstreamConfig(t, clk, u))
	require.NoError(t, err)
	clk.Step(25 * time.Hour)
	u.newRoot()
	require.NoError(t, a.Reconcile())
	roots := a.Roots()
	require.Len(t, roots, 2)
	require.Equal(t, castate.StatePrepared, roots[1].State)
	assert.True(t, a.IssuedHere(roots[1].Cert))
	assert.True(t, a.IssuedHere(roots[0].Cert), "the active intermediate")
	assert.False(t, a.IssuedHere(u.root), "the upstream's new root")
}

// TestIssuedHerePlugin: the directory's CA certificate, and the one it
// replaced until that one's leaves have expired; never the roots of
// root-cert.pem, which may sign other CAs too.
func TestIssuedHerePlugin(t *testing.T) {
	now := time.Now()
	clk := clocktesting.NewFakeClock(now)
	pluginDir := t.TempDir()
	pki := newPluginPKI(t, pluginPKIOptions{now: now})
	writePluginDir(t, pluginDir, pki.files(t, true))
	a, err := pluginAuthority(t, clk, pluginDir, t.TempDir())
	require.NoError(t, err)
	first := issuerOf(t, a)
	require.True(t, first.Equal(pki.cert))
	assert.True(t, a.IssuedHere(first))
	assert.False(t, a.IssuedHere(pki.root.Cert))

	pki2 := newPluginPKI(t, pluginPKIOptions{now: now})
	writePluginDir(t, pluginDir, pki2.files(t, false))
	require.NoError(t, a.cfg.Plugin.Check())
	require.NoError(t, a.manager.syncPlugin())
	assert.True(t, a.IssuedHere(pki2.cert))
	assert.True(t, a.IssuedHere(first), "the replaced CA certificate, whose leaves may still be valid")
	require.NoError(t, a.manager.syncPlugin())
	assert.True(t, a.IssuedHere(first), "an unchanged directory keeps it")

	clk.Step(a.cfg.MaxWorkloadTTL + retireMargin + time.Second)
	assert.False(t, a.IssuedHere(first), "forgotten once every leaf it signed expired")
	assert.True(t, a.IssuedHere(pki2.cert))
}
