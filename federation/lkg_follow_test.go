package federation

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// memLKG is a LastKnownGood shared by a leader's and a follower's poller.
type memLKG struct {
	mu sync.Mutex
	m  map[spiffeid.TrustDomain]LKGEntry
}

func (s *memLKG) Load(td spiffeid.TrustDomain) (*LKGEntry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[td]
	if !ok {
		return nil, nil
	}
	return &e, nil
}

func (s *memLKG) Save(e LKGEntry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[spiffeid.TrustDomain]LKGEntry{}
	}
	s.m[e.TrustDomain] = e
	return nil
}

func withSeq(b *spiffebundle.Bundle, seq uint64) *spiffebundle.Bundle {
	c := b.Clone()
	c.SetSequenceNumber(seq)
	return c
}

// TestFollowerTakesNewerLastKnownGoodOnly: a follower that never polls
// takes what the leader saved, each time LoadLastKnownGood runs again,
// and never goes backwards.
func TestFollowerTakesNewerLastKnownGoodOnly(t *testing.T) {
	pf := newPollFixture(t)
	store := &memLKG{}
	td := pf.ep.TrustDomain
	newPoller := func(sink *memSink) *Poller {
		p, err := NewPoller(PollerConfig{
			Endpoints: []Endpoint{pf.ep},
			Fetcher:   FetcherConfig{AllowPrivate: true, WebRoots: pf.pool, Timeout: 5 * time.Second},
			LKG:       store, Sink: sink, Registerer: prometheus.NewRegistry(),
		})
		require.NoError(t, err)
		return p
	}
	leaderSink, followerSink := &memSink{}, &memSink{}
	lead, follow := newPoller(leaderSink), newPoller(followerSink)
	assert.Empty(t, follow.LoadLastKnownGood())
	assert.Nil(t, followerSink.get(SourceName(td)), "nothing stored, no bootstrap bundle")

	require.NoError(t, lead.Refresh(t.Context(), td))
	assert.Empty(t, follow.LoadLastKnownGood())
	require.True(t, pf.fx.bundle.Equal(followerSink.get(SourceName(td))), "the leader's bundle")

	other := testca.New(t, fetchTD).Bundle()
	steps := []struct {
		name    string
		stored  *spiffebundle.Bundle
		want    *spiffebundle.Bundle
		wantErr string
	}{
		{"same taken again: nothing to do", withSeq(pf.fx.bundle, 8), withSeq(pf.fx.bundle, 8), ""},
		{"older skipped", withSeq(pf.fx.bundle, 6), withSeq(pf.fx.bundle, 8), ""},
		{"same sequence, other keys refused", withSeq(other, 8), withSeq(pf.fx.bundle, 8), "same spiffe_sequence"},
		{"rotation taken", withSeq(other, 9), withSeq(other, 9), ""},
	}
	t.Run("one trust domain", func(t *testing.T) {
		require.NoError(t, store.Save(LKGEntry{TrustDomain: td, Bundle: withSeq(pf.fx.bundle, 8), EndpointURL: pf.ep.URL.String()}))
		require.NoError(t, follow.LoadLastKnownGoodFor(td))
		assert.True(t, withSeq(pf.fx.bundle, 8).Equal(followerSink.get(SourceName(td))))
		assert.NoError(t, follow.LoadLastKnownGoodFor(spiffeid.RequireTrustDomainFromString("not.federated")), "ignored")
	})
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			require.NoError(t, store.Save(LKGEntry{TrustDomain: td, Bundle: st.stored, EndpointURL: pf.ep.URL.String()}))
			n := followerSink.n
			errs := follow.LoadLastKnownGood()
			if st.wantErr != "" {
				require.Len(t, errs, 1)
				assert.ErrorContains(t, errs[0], st.wantErr)
			} else {
				assert.Empty(t, errs)
			}
			assert.True(t, st.want.Equal(followerSink.get(SourceName(td))))
			if !st.want.Equal(st.stored) {
				assert.Equal(t, n, followerSink.n, "the sink is not touched")
			}
			assert.Equal(t, *follow.Status()[0].Sequence, mustSeq(st.want))
		})
	}
}

func mustSeq(b *spiffebundle.Bundle) uint64 {
	s, _ := b.SequenceNumber()
	return s
}

// TestPollerRunsAgainAfterLeadershipReturns: Run ends with the lead's
// context and starts again, polling at once.
func TestPollerRunsAgainAfterLeadershipReturns(t *testing.T) {
	pf := newPollFixture(t)
	p, err := NewPoller(PollerConfig{
		Endpoints: []Endpoint{pf.ep},
		Fetcher:   FetcherConfig{AllowPrivate: true, WebRoots: pf.pool, Timeout: 5 * time.Second},
		Sink:      pf.sink,
	})
	require.NoError(t, err)
	polls := func() float64 {
		return testutil.ToFloat64(p.metrics.fetches.WithLabelValues(pf.ep.TrustDomain.Name(), "ok"))
	}
	for range 2 {
		before := polls()
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		require.Eventually(t, func() bool { return polls() > before }, 10*time.Second, 10*time.Millisecond)
		cancel()
		require.NoError(t, <-done)
		p.mu.Lock()
		assert.Nil(t, p.cron, "no cron left behind")
		p.mu.Unlock()
	}
}
