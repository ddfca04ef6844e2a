package certservice

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/authn"
)

// One node agent service account is every node's: each of its pods has
// its own budget when it acts for workloads, so one node's workloads
// cannot spend every other node's; a caller asking for itself is charged
// by its identity as before.
func TestAdmissionChargesImpersonationPerPod(t *testing.T) {
	a := newAdmission(Config{RateLimit: rate.Limit(1), RateBurst: 1, MaxRateLimiters: 100, QueueSize: 1, Concurrency: 1, Clock: clocktesting.NewFakeClock(time.Unix(0, 0))}, testMetrics(t))
	agentID := spiffeid.RequireFromString("spiffe://example.org/ns/trustbridge-agent/sa/trustbridge-agent")
	web := spiffeid.RequireFromString("spiffe://example.org/ns/shop/sa/web")
	api := spiffeid.RequireFromString("spiffe://example.org/ns/shop/sa/api")
	nodeA := authn.Identity{ID: agentID, Pod: authn.PodRef{Namespace: "trustbridge-agent", Name: "a", UID: "uid-a"}}
	nodeB := authn.Identity{ID: agentID, Pod: authn.PodRef{Namespace: "trustbridge-agent", Name: "b", UID: "uid-b"}}

	assert.Nil(t, a.charge(nodeA, web))
	assert.NotNil(t, a.charge(nodeA, api), "node A's budget is spent")
	assert.Nil(t, a.charge(nodeB, web), "node B's is its own")
	assert.Nil(t, a.charge(authn.Identity{ID: web}, web), "the workload's own budget is apart")
	assert.NotNil(t, a.charge(authn.Identity{ID: web}, web))
}

func testMetrics(t *testing.T) *metrics {
	t.Helper()
	m, err := newMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	return m
}

// queueAdmission is an admission of concurrency slots and a queue of
// size, its maximum wait on clk; call inside a synctest bubble.
func queueAdmission(t *testing.T, concurrency, size int, clk *clocktesting.FakeClock) *admission {
	t.Helper()
	cfg := Config{Concurrency: concurrency, QueueSize: size, QueueTimeout: 20 * time.Second, Clock: clk}
	return newAdmission(cfg.withDefaults(), testMetrics(t))
}

// waiter is one request waiting in a's queue, in a goroutine of its
// own; its outcome arrives on the channel, its slot already given back.
func waiter(ctx context.Context, a *admission) <-chan *refusal {
	out := make(chan *refusal, 1)
	go func() {
		release, ref := a.acquire(ctx, 500, true)
		if release != nil {
			release()
		}
		out <- ref
	}()
	return out
}

// Requests beyond the slots wait and are served in arrival order; the
// gauge counts them while they wait and is back to 0 once all are in.
func TestAdmissionServesWaitersInArrivalOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := queueAdmission(t, 1, 10, clocktesting.NewFakeClock(time.Unix(0, 0)))
		hold, ref := a.acquire(t.Context(), 500, true)
		require.Nil(t, ref)

		const n = 6
		order := make(chan int, n)
		done := make(chan struct{})
		for i := range n {
			go func() {
				release, ref := a.acquire(t.Context(), 500, true)
				if assert.Nil(t, ref) {
					order <- i // before release: the next cannot be served first
					release()
				}
				done <- struct{}{}
			}()
			synctest.Wait() // i is in the queue before i+1 arrives
		}
		assert.Equal(t, float64(n), testutil.ToFloat64(a.m.queueWaiting))
		hold()
		for range n {
			<-done
		}
		close(order)
		var got []int
		for i := range order {
			got = append(got, i)
		}
		assert.Equal(t, []int{0, 1, 2, 3, 4, 5}, got)
		assert.Zero(t, testutil.ToFloat64(a.m.queueWaiting))
		assert.Equal(t, uint64(n+1), histogram(t, a.m.queueWait).GetSampleCount(), "every admission timed, the one that did not wait too")
		assert.True(t, a.slots.TryAcquire(1), "every slot given back")
	})
}

// A full queue refuses at once, saying what to do; it takes requests
// again as soon as one leaves it.
func TestAdmissionFullQueueRefusesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := queueAdmission(t, 1, 2, clocktesting.NewFakeClock(time.Unix(0, 0)))
		hold, ref := a.acquire(t.Context(), 500, true)
		require.Nil(t, ref)
		first, second := waiter(t.Context(), a), waiter(t.Context(), a)
		synctest.Wait()

		// In this goroutine: a wait would deadlock the bubble and fail.
		release, ref := a.acquire(t.Context(), 500, true)
		assert.Nil(t, release)
		require.NotNil(t, ref)
		assert.Equal(t, codes.ResourceExhausted, ref.code)
		assert.Equal(t, "queue_full", ref.reason)
		assert.Contains(t, ref.msg, "signing queue full")
		assert.Contains(t, ref.msg, "--sign-queue-size")
		assert.Equal(t, 2.0, testutil.ToFloat64(a.m.queueWaiting), "the refused request never counted")

		hold()
		assert.Nil(t, <-first)
		assert.Nil(t, <-second)
		assert.Zero(t, testutil.ToFloat64(a.m.queueWaiting))
		assert.True(t, a.slots.TryAcquire(1))
	})
}

// A request larger than queueUnit takes a place per queueUnit, so a
// queue of the largest CSRs holds fewer of them; an empty queue still
// takes one request larger than itself.
func TestAdmissionLargeRequestsTakeMorePlaces(t *testing.T) {
	assert.Equal(t, int64(1), queuePlaces(0))
	assert.Equal(t, int64(1), queuePlaces(queueUnit))
	assert.Equal(t, int64(2), queuePlaces(queueUnit+1))
	synctest.Test(t, func(t *testing.T) {
		a := queueAdmission(t, 1, 3, clocktesting.NewFakeClock(time.Unix(0, 0)))
		hold, ref := a.acquire(t.Context(), 500, true)
		require.Nil(t, ref)
		big := make(chan *refusal, 1)
		go func() {
			release, ref := a.acquire(t.Context(), 2*queueUnit, true) // 2 of the 3 places
			if release != nil {
				release()
			}
			big <- ref
		}()
		synctest.Wait()
		_, ref = a.acquire(t.Context(), queueUnit+1, true)
		require.NotNil(t, ref, "2 more places do not fit")
		assert.Equal(t, "queue_full", ref.reason)
		small := waiter(t.Context(), a) // 1 does
		synctest.Wait()
		assert.Equal(t, 2.0, testutil.ToFloat64(a.m.queueWaiting))
		hold()
		assert.Nil(t, <-big)
		assert.Nil(t, <-small)

		hold, ref = a.acquire(t.Context(), 500, true)
		require.Nil(t, ref)
		huge := make(chan *refusal, 1)
		go func() {
			release, ref := a.acquire(t.Context(), 20*queueUnit, true)
			if release != nil {
				release()
			}
			huge <- ref
		}()
		synctest.Wait()
		assert.Equal(t, 1.0, testutil.ToFloat64(a.m.queueWaiting), "an empty queue takes it")
		hold()
		assert.Nil(t, <-huge)
	})
}

// A waiting call holds its request headers too: they count towards its
// places, so padding headers (up to MaxHeaderListSize) cannot put several
// times a place's memory in one place.
func TestAdmissionHeadersTakePlaces(t *testing.T) {
	assert.Zero(t, metadataSize(t.Context()))
	padded := metadata.NewIncomingContext(t.Context(), metadata.Pairs("x-pad-bin", strings.Repeat("p", 2*queueUnit)))
	assert.Equal(t, len("x-pad-bin")+2*queueUnit+32, metadataSize(padded))
	synctest.Test(t, func(t *testing.T) {
		a := queueAdmission(t, 1, 3, clocktesting.NewFakeClock(time.Unix(0, 0)))
		hold, ref := a.acquire(t.Context(), 500, true)
		require.Nil(t, ref)
		done := make(chan *refusal, 1)
		go func() {
			ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs("x-pad-bin", strings.Repeat("p", 2*queueUnit)))
			release, ref := a.acquire(ctx, 500, true) // 3 places: 500 bytes and 8 KiB of headers
			if release != nil {
				release()
			}
			done <- ref
		}()
		synctest.Wait()
		_, ref = a.acquire(t.Context(), 500, true)
		require.NotNil(t, ref, "the padded request took the queue's 3 places")
		assert.Equal(t, "queue_full", ref.reason)
		hold()
		assert.Nil(t, <-done)
	})
}

// Config.Authorized hears of a request that may confirm its connection,
// and only of those.
func TestAdmissionConfirmsOnlyWhenAsked(t *testing.T) {
	a := queueAdmission(t, 1, 3, clocktesting.NewFakeClock(time.Unix(0, 0)))
	var heard int
	a.authorized = func(context.Context) { heard++ }
	release, ref := a.acquire(t.Context(), 500, false)
	require.Nil(t, ref)
	release()
	assert.Zero(t, heard, "a single-use credential's request")
	release, ref = a.acquire(t.Context(), 500, true)
	require.Nil(t, ref)
	release()
	assert.Equal(t, 1, heard)
}

// A waiter whose caller cancels, or whose deadline passes, leaves the
// queue at once, with its caller's code, and takes no slot with it: the
// room it leaves is taken by the next, and the slot serves the next.
func TestAdmissionCallerLeavesQueue(t *testing.T) {
	for name, tc := range map[string]struct {
		ctx  func(t *testing.T) (context.Context, func())
		code codes.Code
	}{
		"canceled": {func(t *testing.T) (context.Context, func()) {
			return context.WithCancel(t.Context())
		}, codes.Canceled},
		// The bubble's clock moves once every goroutine waits.
		"deadline": {func(t *testing.T) (context.Context, func()) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			return ctx, func() { time.Sleep(2 * time.Second); cancel() }
		}, codes.DeadlineExceeded},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := queueAdmission(t, 1, 1, clocktesting.NewFakeClock(time.Unix(0, 0)))
				hold, ref := a.acquire(t.Context(), 500, true)
				require.Nil(t, ref)
				ctx, leave := tc.ctx(t)
				left := waiter(ctx, a)
				synctest.Wait()
				assert.Equal(t, 1.0, testutil.ToFloat64(a.m.queueWaiting))

				leave()
				ref = <-left
				require.NotNil(t, ref)
				assert.Equal(t, tc.code, ref.code)
				assert.Equal(t, "canceled", ref.reason)
				assert.Zero(t, testutil.ToFloat64(a.m.queueWaiting))

				next := waiter(t.Context(), a) // the queue of 1 has room again
				synctest.Wait()
				hold()
				assert.Nil(t, <-next, "the slot went to the next waiter")
				assert.True(t, a.slots.TryAcquire(1), "no slot leaked")
			})
		})
	}
}

// A caller already gone is not queued, nor given a free slot.
func TestAdmissionCallerGoneBeforeQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := queueAdmission(t, 1, 1, clocktesting.NewFakeClock(time.Unix(0, 0)))
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		release, ref := a.acquire(ctx, 500, true)
		assert.Nil(t, release)
		require.NotNil(t, ref)
		assert.Equal(t, codes.Canceled, ref.code)
		assert.True(t, a.slots.TryAcquire(1))
	})
}

// A waiter still waiting at the server's maximum wait (on the injected
// clock) is refused with a code clients retry, naming the flags.
func TestAdmissionMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := clocktesting.NewFakeClock(time.Unix(0, 0))
		a := queueAdmission(t, 1, 4, clk)
		hold, ref := a.acquire(t.Context(), 500, true)
		require.Nil(t, ref)
		out := waiter(t.Context(), a)
		synctest.Wait()

		clk.Step(a.maxWait - time.Nanosecond)
		synctest.Wait()
		select {
		case ref := <-out:
			t.Fatalf("refused before the maximum wait: %v", ref)
		default:
		}
		clk.Step(time.Nanosecond)
		ref = <-out
		require.NotNil(t, ref)
		assert.Equal(t, codes.ResourceExhausted, ref.code)
		assert.Equal(t, "queue_timeout", ref.reason)
		assert.Contains(t, ref.msg, "20s")
		assert.Contains(t, ref.msg, "--sign-queue-timeout")
		assert.Zero(t, testutil.ToFloat64(a.m.queueWaiting))
		h := histogram(t, a.m.queueWait)
		assert.Equal(t, 20.0, h.GetSampleSum(), "the wait is timed on the injected clock")

		hold()
		assert.True(t, a.slots.TryAcquire(1), "no slot leaked")
		assert.False(t, clk.HasWaiters(), "the timer is stopped")
	})
}

func histogram(t *testing.T, h prometheus.Histogram) *dto.Histogram {
	t.Helper()
	var m dto.Metric
	require.NoError(t, h.Write(&m))
	return m.GetHistogram()
}
