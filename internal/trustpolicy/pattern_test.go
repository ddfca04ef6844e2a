package trustpolicy

import (
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPatternMatches(t *testing.T) {
	tests := []struct {
		pattern, id string
		want        bool
	}{
		{"spiffe://td/ns/pay/*", "spiffe://td/ns/pay/sa/x", true},
		{"spiffe://td/ns/pay/*", "spiffe://td/ns/pay/x", true},
		{"spiffe://td/ns/pay/*", "spiffe://td/ns/payments/sa/x", false},
		{"spiffe://td/ns/pay/*", "spiffe://td/ns/pay", false},
		{"spiffe://td/ns/pay/*", "spiffe://td/ns", false},
		{"spiffe://td/ns/pay/*", "spiffe://other/ns/pay/sa/x", false},
		{"spiffe://td/ns/pay/*", "spiffe://td.evil/ns/pay/sa/x", false},
		{"spiffe://td/*", "spiffe://td/a", true},
		{"spiffe://td/*", "spiffe://tdx/a", false},
		{"spiffe://td/ns/pay/sa/api", "spiffe://td/ns/pay/sa/api", true},
		{"spiffe://td/ns/pay/sa/api", "spiffe://td/ns/pay/sa/api2", false},
		{"spiffe://td/ns/pay/sa/api", "spiffe://td/ns/pay/sa", false},
	}
	for _, tt := range tests {
		t.Run(tt.pattern+" "+tt.id, func(t *testing.T) {
			p, err := ParsePattern(tt.pattern)
			require.NoError(t, err)
			assert.Equal(t, tt.want, p.Matches(spiffeid.RequireFromString(tt.id)))
		})
	}
}

func TestParsePatternRefuses(t *testing.T) {
	for _, s := range []string{
		"", "spiffe://td", "spiffe://td/", "spiffe://td/ns/pay/", "spiffe://td/ns/pay*",
		"spiffe://td/ns/*/sa/x", "spiffe://td/ns/%70ay", "spiffe://TD/ns/pay", "spiffe://td//x",
		"spiffe://td/ns/./x", "spiffe://td/ns/../x", "spiffe://td/ns/pay/**", "spiffe://td/ns/.*",
		"/ns/pay/*", "https://td/ns/pay", "spiffe://td/ns/pay?x", "spiffe://td/ns/pay#x", "spiffe://*/x",
	} {
		t.Run(s, func(t *testing.T) {
			_, err := ParsePattern(s)
			assert.Error(t, err)
		})
	}
}

func TestPatternSAN(t *testing.T) {
	v, prefix := MustParsePattern("spiffe://td/ns/pay/*").SAN()
	assert.Equal(t, "spiffe://td/ns/pay/", v)
	assert.True(t, prefix)
	v, prefix = MustParsePattern("spiffe://td/*").SAN()
	assert.Equal(t, "spiffe://td/", v)
	assert.True(t, prefix)
	v, prefix = MustParsePattern("spiffe://td/ns/pay/sa/a").SAN()
	assert.Equal(t, "spiffe://td/ns/pay/sa/a", v)
	assert.False(t, prefix)
}
