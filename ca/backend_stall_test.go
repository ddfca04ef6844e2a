package ca

import (
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca/castate"
)

// stallingBackend blocks Version and Load while stalled, like an API server
// that has gone unreachable until the client's timeout.
type stallingBackend struct {
	*memBackend
	stalled chan struct{} // nil: not stalled
	entered chan struct{}
}

func (s *stallingBackend) wait() {
	if s.stalled == nil {
		return
	}
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-s.stalled
}

func (s *stallingBackend) Version() (string, error) { s.wait(); return s.memBackend.Version() }
func (s *stallingBackend) Load(td string) (*castate.Journal, []*castate.Root, []*castate.JWTKey, string, error) {
	s.wait()
	return s.memBackend.Load(td)
}

// TestStalledStateReadKeepsSigningAndServing: while a check of the shared
// state waits on the API server, the CA keeps signing with and serving the
// last good state; the check must not hold the lock readers need.
func TestStalledStateReadKeepsSigningAndServing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		leader bool
		check  func(a *Authority) error
	}{
		{"follower reconcile", false, (*Authority).Reconcile},
		{"follower reload", false, (*Authority).Reload},
		{"leader reconcile", true, (*Authority).Reconcile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			mem := newMemBackend()
			_, err := New(backendConfig(clk, mem, leaderFlag(true)))
			require.NoError(t, err)
			sb := &stallingBackend{memBackend: mem}
			a, err := New(backendConfig(clk, sb, leaderFlag(tc.leader)))
			require.NoError(t, err)
			want := a.Bundle()

			sb.stalled, sb.entered = make(chan struct{}), make(chan struct{}, 1)
			done := make(chan error, 1)
			go func() { done <- tc.check(a) }()
			<-sb.entered

			id := spiffeid.RequireFromPath(tdExample, "/w")
			csr := workloadCSR(t, id)
			served := make(chan error, 1)
			go func() {
				_, err := a.Sign(csr, id, 0)
				if err == nil {
					assert.True(t, want.Equal(a.Bundle()))
					err = a.Ready()
				}
				served <- err
			}()
			select {
			case err := <-served:
				require.NoError(t, err, "signs and serves the last good state meanwhile")
			case <-time.After(5 * time.Second):
				close(sb.stalled)
				<-done
				t.Fatal("signing and serving blocked behind a stalled state read")
			}
			close(sb.stalled)
			require.NoError(t, <-done)
		})
	}
}
