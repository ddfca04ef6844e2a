package agent

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/loop"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/sds"
)

// TestBundleWatcherReconnectsAtCertificateEnd: the server ends
// WatchBundles Unauthenticated at the NotAfter of the certificate that
// opened it, once per certificate lifetime. After progress that is a
// reconnect with the current certificate, not an outage: no stale
// bundles, no warning, the gauge stays 1, no wait for a backoff (the
// clock here never moves). A reconnect that fails is an outage.
func TestBundleWatcherReconnectsAtCertificateEnd(t *testing.T) {
	caA := testca.New(t, tdA.Name())
	trust := sds.NewTrustCell()
	require.NoError(t, trust.Set([]*x509bundle.Bundle{bundleOf(caA)}))
	ident := newFakeIdentity(t)
	ident.set(t, []*spiffebundle.Bundle{caA.Bundle()})
	up := newIdentityUpstream(t, caA, trust, ident)
	m, err := newMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	var logs syncBuffer
	out := newBundleCell(nil, errNoBundlesYet)
	w := &bundleWatcher{
		addr: up.addr, tlsConfig: newFakeRotator(t, caA, workload).ClientTLS, local: tdA, out: out,
		clock: clocktesting.NewFakeClock(time.Now()), log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})), metrics: m,
		retry: loop.Backoff{Base: time.Hour, Max: time.Hour, Jitter: retryJitter},
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, w.Run(ctx)) })
	defer wg.Wait()
	defer cancel()

	successes := m.bundleResponses.WithLabelValues(resultSuccess)
	received := func(n float64) {
		t.Helper()
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Equal(c, n, testutil.ToFloat64(successes))
		}, 5*time.Second, time.Millisecond)
	}
	received(1)
	ident.ends <- status.Error(codes.Unauthenticated, "the client certificate expired")
	received(2)
	_, _, _, stale := out.get()
	assert.NoError(t, stale)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.bundlesConnected))
	assert.Equal(t, 0.0, testutil.ToFloat64(m.bundleStreamErrs))
	assert.NotContains(t, logs.String(), "lost the bundle stream")

	t.Run("a reconnect that fails is an outage", func(t *testing.T) {
		ident.refuse.Store(true)
		ident.ends <- status.Error(codes.Unauthenticated, "the client certificate expired")
		assert.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Contains(c, logs.String(), "lost the bundle stream")
			assert.Equal(c, 0.0, testutil.ToFloat64(m.bundlesConnected))
			_, _, _, stale := out.get()
			assert.Error(c, stale)
		}, 5*time.Second, time.Millisecond)
	})
}
