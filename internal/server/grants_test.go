package server

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMaxRenewalLifetimeFlag(t *testing.T) {
	err := serverError(t, func() Config {
		o := baseServerOptions("example.org", t.TempDir())
		o.GRPC = GRPCConfig{Listen: "127.0.0.1:0", TokenReview: TokenReviewOff, MaxRenewalLifetime: -time.Hour}
		return o
	}())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--max-renewal-lifetime -1h0m0s is negative")
}
