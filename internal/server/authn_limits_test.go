package server

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/authn"
)

func TestAuthnLimits(t *testing.T) {
	def := authnLimits{}.withDefaults()
	assert.Equal(t, authnLimits{
		verifyPerPeer: authn.DefaultMaxVerificationsPerPeer, verifyMax: authn.DefaultMaxVerifications,
		reviewPerPeer: authn.DefaultMaxReviewsPerPeer, reviewPeerRate: authn.DefaultPeerReviewRate, reviewPeerBurst: authn.DefaultPeerReviewBurst,
	}, def)
	require.NoError(t, def.check())
	tests := []struct {
		name string
		mut  func(*authnLimits)
	}{
		{"negative per-peer verifications", func(o *authnLimits) { o.verifyPerPeer = -1 }},
		{"negative verifications", func(o *authnLimits) { o.verifyMax = -3 }},
		{"negative per-peer reviews", func(o *authnLimits) { o.reviewPerPeer = -1 }},
		{"negative rate", func(o *authnLimits) { o.reviewPeerRate = -1 }},
		{"NaN rate", func(o *authnLimits) { o.reviewPeerRate = math.NaN() }},
		{"negative burst", func(o *authnLimits) { o.reviewPeerBurst = -2 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := def
			tt.mut(&o)
			err := o.withDefaults().check()
			require.Error(t, err)
			assert.Contains(t, err.Error(), "must be positive")
		})
	}
}

// The flags reach the authenticators: a server refuses to start on a bad
// value, naming the flag.
func TestAuthnLimitFlagErrors(t *testing.T) {
	o := baseServerOptions("example.org", t.TempDir())
	o.GRPC = GRPCConfig{Listen: "127.0.0.1:0", TokenReview: TokenReviewOff}
	o.GRPC.verifyPerPeer = -1
	err := serverError(t, o)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--client-cert-verify-per-peer")
}
