package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/loop"
)

// bundleWatcher follows the server's WatchBundles (the bundles the trust
// policy lets this workload trust, X.509 and JWT authorities) into a
// bundleCell for the Workload API. While the server cannot be reached the
// last good bundles stay, marked stale, and the outage is logged once and
// shown by trustbridge_agent_bundles_connected.
type bundleWatcher struct {
	addr      string
	tlsConfig func() *tls.Config
	local     spiffeid.TrustDomain
	out       *bundleCell
	issuer    *jwtIssuerCell
	taints    *taintCell
	// taintsOnly: no Workload API reads out; the stream is followed for
	// the taints alone (an agent without --workload-api-socket).
	taintsOnly bool
	clock      clock.Clock
	log        *slog.Logger
	metrics    *metrics
	retry      loop.Backoff

	// down is set while an outage is logged; withheld holds the trust
	// domains already logged as withheld.
	down     bool
	withheld map[string]bool
}

// Run watches until ctx is done, reconnecting with capped exponential
// backoff and jitter; it returns nil when ctx is done.
func (w *bundleWatcher) Run(ctx context.Context) error {
	failures := 0
	for {
		progressed, err := w.stream(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if progressed && status.Code(err) == codes.Unauthenticated {
			// The server ends a stream at the NotAfter of the certificate
			// that opened it, once per certificate lifetime; the Rotator
			// renewed before: reconnect at once with the current one, no
			// outage. A failing reconnect makes no progress and is one.
			w.log.Debug("the server ended WatchBundles at the end of this agent's certificate; reconnecting with the current one", "ca_addr", w.addr, logattr.Error, err.Error())
			failures = 0
			continue
		}
		if progressed {
			failures = 0
		}
		failures++
		d := w.retry.Delay(failures, rand.Float64())
		w.metrics.bundleStreamErrs.Inc()
		w.outage(err, d)
		t := w.clock.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

// outage marks the bundles stale and says so once per outage.
func (w *bundleWatcher) outage(err error, retry time.Duration) {
	stale := fmt.Errorf("the certificate service at %s is unreachable: %w", w.addr, err)
	w.out.setStale(stale)
	w.metrics.bundlesConnected.Set(0)
	if w.down {
		w.log.Debug("WatchBundles still failing", "ca_addr", w.addr, logattr.Error, err.Error(), "retry_in", retry)
		return
	}
	w.down = true
	msg := "lost the bundle stream from the certificate service; the Workload API keeps serving the last good bundles until it is back"
	switch {
	case w.taintsOnly && status.Code(err) == codes.Unimplemented:
		msg = "the server does not serve trustbridge.identity.v1 WatchBundles (older than this agent?); tainted authorities cannot reach this agent, whose certificate is renewed on schedule only"
	case w.taintsOnly:
		msg = "lost the bundle stream from the certificate service; tainted authorities reach this agent again once it is back"
	case status.Code(err) == codes.Unimplemented:
		msg = "the server does not serve trustbridge.identity.v1 WatchBundles (older than this agent?); the Workload API serves the local trust domain only"
	}
	w.log.Warn(msg, "ca_addr", w.addr, logattr.Error, err.Error(), "retry_in", retry)
}

// stream runs one WatchBundles stream; progressed reports whether it
// delivered good bundles. A message caclient refuses is counted and
// logged and the stream goes on, the last good bundles still served.
func (w *bundleWatcher) stream(ctx context.Context) (progressed bool, err error) {
	conn, err := caclient.Dial(w.addr, w.tlsConfig(), "")
	if err != nil {
		return false, err
	}
	defer conn.Close()
	err = caclient.WatchBundles(ctx, conn, w.local, func(b *caclient.Bundles, err error) error {
		if err != nil {
			w.metrics.bundleResponses.WithLabelValues(resultFailure).Inc()
			w.log.Warn("the server sent bundles that do not parse; keeping the last good ones", "ca_addr", w.addr, logattr.Error, err.Error())
			return nil
		}
		w.metrics.bundleResponses.WithLabelValues(resultSuccess).Inc()
		w.metrics.bundlesConnected.Set(1)
		progressed = true
		w.issuer.take(w.local, b, w.log)
		w.taints.take(b, w.log)
		if w.taintsOnly {
			w.back(len(b.Bundles))
			return nil
		}
		w.publish(b.Bundles, b.Withheld)
		return nil
	})
	return progressed, err
}

func (w *bundleWatcher) publish(bundles []*spiffebundle.Bundle, withheld []string) {
	w.out.set(bundles)
	w.back(len(bundles))
	if w.withheld == nil {
		w.withheld = make(map[string]bool)
	}
	for _, td := range withheld {
		if !w.withheld[td] && len(w.withheld) < maxTrustDomains {
			w.withheld[td] = true
			w.log.Info("trust domain granted only for some peers; a Workload API bundle cannot carry that limit, so it is not served there (SDS serves it with the limit)",
				logattr.TrustDomain, td)
		}
	}
}

// back ends the outage logged, if any.
func (w *bundleWatcher) back(trustDomains int) {
	if w.down {
		w.down = false
		w.log.Info("bundle stream from the certificate service is back", "ca_addr", w.addr, "trust_domains", trustDomains)
	}
}
