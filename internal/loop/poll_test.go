package loop

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestRun(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	ctx, cancel := context.WithCancel(context.Background())
	calls := make(chan struct{}, 10)
	done := make(chan error, 1)
	go func() { done <- Poll(ctx, clk, time.Second, func() { calls <- struct{}{} }) }()
	require.Eventually(t, clk.HasWaiters, 5*time.Second, time.Millisecond)
	assert.Empty(t, calls, "nothing before the first interval")
	clk.Step(time.Second)
	<-calls
	cancel()
	require.NoError(t, <-done)
}
