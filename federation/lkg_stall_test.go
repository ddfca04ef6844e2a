package federation

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stallingLKG blocks Load and Save while stalled, like a store on an API
// server that has gone unreachable until the client's timeout.
type stallingLKG struct {
	memLKG
	stalled chan struct{} // nil: not stalled
	entered chan struct{}
}

func (s *stallingLKG) wait() {
	if s.stalled == nil {
		return
	}
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-s.stalled
}

func (s *stallingLKG) Load(td spiffeid.TrustDomain) (*LKGEntry, error) {
	s.wait()
	return s.memLKG.Load(td)
}

func (s *stallingLKG) Save(e LKGEntry) error {
	s.wait()
	return s.memLKG.Save(e)
}

// TestStalledLastKnownGoodStoreDoesNotBlockThePoller: while the shared
// store hangs, the poller still answers: its status, and the roots other
// polls authenticate with, do not wait for the store.
func TestStalledLastKnownGoodStoreDoesNotBlockThePoller(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(p *Poller, td spiffeid.TrustDomain) error
	}{
		{"follower load", func(p *Poller, td spiffeid.TrustDomain) error { return p.LoadLastKnownGoodFor(td) }},
		{"leader save after a poll", func(p *Poller, td spiffeid.TrustDomain) error { return p.Refresh(t.Context(), td) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pf := newPollFixture(t)
			store := &stallingLKG{}
			td := pf.ep.TrustDomain
			require.NoError(t, store.Save(LKGEntry{TrustDomain: td, Bundle: withSeq(pf.fx.bundle, 5), EndpointURL: pf.ep.URL.String()}))
			p, err := NewPoller(PollerConfig{
				Endpoints: []Endpoint{pf.ep},
				Fetcher:   FetcherConfig{AllowPrivate: true, WebRoots: pf.pool, Timeout: 5 * time.Second},
				LKG:       store, Sink: pf.sink, Registerer: prometheus.NewRegistry(),
			})
			require.NoError(t, err)
			require.Empty(t, p.LoadLastKnownGood())

			store.stalled, store.entered = make(chan struct{}), make(chan struct{}, 1)
			done := make(chan error, 1)
			go func() { done <- tc.run(p, td) }()
			<-store.entered
			answered := make(chan []Status, 1)
			go func() {
				_, _ = p.fetcher.cfg.Roots.X509BundleFor(td)
				answered <- p.Status()
			}()
			select {
			case st := <-answered:
				assert.Len(t, st, 1)
			case <-time.After(5 * time.Second):
				close(store.stalled)
				<-done
				t.Fatal("the poller blocked behind a stalled last-known-good store")
			}
			close(store.stalled)
			require.NoError(t, <-done)
		})
	}
}
