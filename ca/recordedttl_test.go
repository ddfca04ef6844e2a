package ca

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A damaged journal's recorded maximum never becomes a negative clamp,
// which would make every signing a policy fault.
func TestRecordedTTL(t *testing.T) {
	tests := []struct {
		name    string
		seconds int64
		want    time.Duration
	}{
		{"none", 0, 0},
		{"negative", -5, 0},
		{"hour", 3600, time.Hour},
		{"overflow", math.MaxInt64 / 1000, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, recordedTTL(tt.seconds))
		})
	}
}
