package policycrd

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// Until the ClusterTrustPolicy resources are read, SDS callers get the
// local trust domain only, even where the policy in force (here none:
// every trust domain) would give more; once read, the policy decides, and
// the streams waiting on the gate's channel are woken.
func TestGateFailsClosedUntilSynced(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	partner := spiffeid.RequireTrustDomainFromString("partner.example")
	access := trustpolicy.NewAccess(trustpolicy.NewCell(nil), nil)
	t.Cleanup(access.Close)
	synced := make(chan struct{})
	gate, err := NewGate(access, synced, td)
	require.NoError(t, err)
	ident := authn.Identity{ID: spiffeid.RequireFromPath(td, "/ns/a/sa/b")}

	d, ch := gate.Decide(ident)
	_, ok := d.Allows(partner)
	assert.False(t, ok, "not synced: no federated trust domain")
	_, ok = d.Allows(td)
	assert.True(t, ok, "the local trust domain always")
	assert.Equal(t, (<-chan struct{})(synced), ch, "woken when the resources are read")

	close(synced)
	d, _ = gate.Decide(ident)
	_, ok = d.Allows(partner)
	assert.True(t, ok, "synced, no policy: every trust domain")
}

// The gate's watcher runs until the server stops, also once the resources
// were read: the server's parts run as a group that ends when any part
// returns, so returning at sync stopped the whole server a second after
// it started with --trust-policy-crd.
func TestGateWatchRunsUntilStopped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		td := spiffeid.RequireTrustDomainFromString("example.org")
		access := trustpolicy.NewAccess(trustpolicy.NewCell(nil), nil)
		t.Cleanup(access.Close)
		synced := make(chan struct{})
		gate, err := NewGate(access, synced, td)
		require.NoError(t, err)
		var logs bytes.Buffer
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- gate.Watch(ctx, time.Minute, slog.New(slog.NewTextHandler(&logs, nil))) }()

		time.Sleep(time.Minute) // the fake clock of the bubble: the warning is due
		synctest.Wait()
		assert.Contains(t, logs.String(), "ClusterTrustPolicy resources not read yet")
		close(synced)
		synctest.Wait()
		assert.Contains(t, logs.String(), "ClusterTrustPolicy resources read")
		select {
		case err := <-done:
			t.Fatalf("watch returned after the sync (%v): that stops the server", err)
		default:
		}
		cancel()
		synctest.Wait()
		select {
		case err := <-done:
			assert.NoError(t, err)
		default:
			t.Fatal("watch still running after the server stopped")
		}
	})
}
