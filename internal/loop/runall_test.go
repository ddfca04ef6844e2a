package loop

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestRunEndsAllWhenOneEnds(t *testing.T) {
	boom := errors.New("boom")
	waiter := func(ctx context.Context) error { <-ctx.Done(); return nil }
	assert.ErrorIs(t, RunAll(t.Context(), waiter, func(context.Context) error { return boom }, waiter), boom)
	assert.NoError(t, RunAll(t.Context(), waiter, func(context.Context) error { return nil }), "a part ending cleanly ends the rest too")

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	assert.NoError(t, RunAll(ctx, waiter, waiter), "the caller's cancel ends them")
	assert.NoError(t, RunAll(t.Context()), "no parts")
}
