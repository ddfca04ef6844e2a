package signbench

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestPercentile(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		ds := make([]time.Duration, len(vs))
		for i, v := range vs {
			ds[i] = time.Duration(v) * time.Millisecond
		}
		return ds
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	for _, tc := range []struct {
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{nil, 0.99, 0},
		{ms(7), 0.5, 7 * time.Millisecond},
		{ms(1, 2), 0.5, time.Millisecond},
		{ms(1, 2, 3), 0.5, 2 * time.Millisecond},
		{ms(hundred...), 0.99, 99 * time.Millisecond},
		{ms(hundred...), 1, 100 * time.Millisecond},
		{ms(hundred...), 0, time.Millisecond},
	} {
		assert.Equal(t, tc.want, percentile(tc.sorted, tc.p), "p%v of %v", tc.p, tc.sorted)
	}
}

// procCPU reads what getrusage says of the same process, to its 10 ms
// ticks: the fields of /proc's stat it reads are the right ones.
func TestProcReaders(t *testing.T) {
	self := os.Getpid()
	before := selfCPU()
	for selfCPU()-before < 200*time.Millisecond { // CPU time, not wall time: a busy loop
	}
	cpu, err := procCPU(self)
	require.NoError(t, err)
	ru := selfCPU()
	assert.InDelta(t, ru.Seconds(), cpu.Seconds(), (4 * clockTick).Seconds(), "/proc's %v against getrusage's %v", cpu, ru)
	assert.GreaterOrEqual(t, cpu, 200*time.Millisecond-4*clockTick)
	rss, err := procStatusKiB(self, "VmRSS")
	require.NoError(t, err)
	assert.Positive(t, rss)

	_, err = procStatusKiB(self, "VmNoSuchField")
	assert.ErrorContains(t, err, "no VmNoSuchField")
	// No process has a pid above the kernel's limit (4194304 at most).
	_, err = procCPU(1 << 30)
	assert.ErrorContains(t, err, "CPU time of process")
	_, err = procStatusKiB(1<<30, "VmRSS")
	assert.ErrorContains(t, err, "memory of process")
	_, err = runLoad(1<<30, nil, 1, nil)
	assert.Error(t, err, "a server that is gone is an error, not a zero")
}

// A call whose answer is not a gRPC status (the client found no
// certificate in it) fails the load; refusals are counted, by code and
// message, with at most maxReasons messages and the rest as other
// reasons.
func TestTallyLoad(t *testing.T) {
	n := maxReasons + 3
	fail := func(err error) call {
		return func(_ context.Context, _ client, i int) error {
			if i == 0 {
				return err
			}
			return status.Errorf(codes.ResourceExhausted, "refusal %d", i)
		}
	}
	l, err := runLoad(os.Getpid(), []client{nil}, n, fail(nil))
	require.NoError(t, err)
	assert.Equal(t, n, l.calls)
	assert.Equal(t, 1, l.served)
	assert.Equal(t, map[codes.Code]int{codes.ResourceExhausted: n - 1}, l.refused)
	assert.Len(t, l.reasons, maxReasons+1)
	assert.Equal(t, n-1, sumValues(l.reasons))
	assert.Equal(t, n-1-maxReasons, l.reasons[otherReasons])

	var sum load
	sum.add(l)
	sum.add(l)
	assert.Equal(t, 2*n, sum.calls)
	assert.Equal(t, map[codes.Code]int{codes.ResourceExhausted: 2 * (n - 1)}, sum.refused)
	assert.Equal(t, 2*(n-1), sumValues(sum.reasons))
	assert.Len(t, sum.latencies, 2*n)

	_, err = runLoad(os.Getpid(), []client{nil}, n, fail(errors.New("no certificate")))
	assert.ErrorContains(t, err, "call 0: no certificate")
}

// A target that skips leaves its rows out, not the benchmark.
func TestStartOptional(t *testing.T) {
	skips := func(tb testing.TB, _ targetOptions) target {
		tb.Skipf("no %s", "binary")
		panic("not reached")
	}
	got, why := startOptional(t, skips, targetOptions{})
	assert.Nil(t, got)
	assert.Equal(t, "no binary", why)
	assert.False(t, t.Skipped())

	want := &trustbridgeTarget{pid: 1}
	got, why = startOptional(t, func(testing.TB, targetOptions) target { return want }, targetOptions{})
	assert.Same(t, want, got)
	assert.Empty(t, why)
}

func sumValues[K comparable](m map[K]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// A burst's workload retries what the server may refuse for now, as
// Istio's agent does, and nothing else.
func TestWithRetries(t *testing.T) {
	exhausted := status.Error(codes.ResourceExhausted, "queue full")
	for _, tc := range []struct {
		name        string
		answers     []error // in order; the last repeats
		wantErr     codes.Code
		wantCalls   int
		wantRetried int64
	}{
		{"served at once", []error{nil}, codes.OK, 1, 0},
		{"served after two refusals", []error{exhausted, status.Error(codes.Unavailable, "busy"), nil}, codes.OK, 3, 2},
		{"a refusal not retried", []error{status.Error(codes.InvalidArgument, "bad CSR"), nil}, codes.InvalidArgument, 1, 0},
		{"refused after every retry", []error{exhausted}, codes.ResourceExhausted, burstRetries + 1, burstRetries},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var retried atomic.Int64
			calls := 0
			err := withRetries(context.Background(), &retried, time.Microsecond, func() error {
				err := tc.answers[min(calls, len(tc.answers)-1)]
				calls++
				return err
			})
			assert.Equal(t, tc.wantErr, status.Code(err))
			assert.Equal(t, tc.wantCalls, calls)
			assert.Equal(t, tc.wantRetried, retried.Load())
		})
	}
}
