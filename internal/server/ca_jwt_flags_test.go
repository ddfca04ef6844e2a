package server

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
)

func TestJWTKeyFlags(t *testing.T) {
	ok := JWTKeyConfig{keyType: "ES256", keyTTL: ca.DefaultConfig().JWTKeyTTL, maxSVIDTTL: time.Hour}
	tests := []struct {
		name string
		edit func(o *JWTKeyConfig)
		want string
	}{
		{"defaults", func(*JWTKeyConfig) {}, ""},
		{"RS256", func(o *JWTKeyConfig) { o.keyType = "RS256" }, ""},
		{"unknown type", func(o *JWTKeyConfig) { o.keyType = "es256" }, `--jwt-key-type: ca: unknown JWT key type "es256" (valid: ES256, ES384, RS256)`},
		{"negative", func(o *JWTKeyConfig) { o.svidTTL = -time.Minute }, "--jwt-svid-ttl -1m0s is negative; give a positive duration such as 5m"},
		{"over the maximum", func(o *JWTKeyConfig) { o.svidTTL = 2 * time.Hour }, "--jwt-svid-ttl 2h0m0s exceeds --max-jwt-svid-ttl 1h0m0s; lower the one or raise the other"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := ok
			tt.edit(&o)
			var c ca.Config
			err := o.apply(&c)
			if tt.want == "" {
				require.NoError(t, err)
				assert.Equal(t, ca.JWTKeyType(o.keyType), c.JWTKeyType)
				assert.Equal(t, o.maxSVIDTTL, c.MaxJWTSVIDTTL)
				return
			}
			assert.EqualError(t, err, tt.want)
		})
	}
}
