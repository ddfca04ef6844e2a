package certservice

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestValidity(t *testing.T) {
	tests := []struct {
		seconds int64
		want    time.Duration
		refused bool
	}{
		{0, 0, false},
		{3600, time.Hour, false},
		{-1, 0, true},
		{1 << 62, time.Duration(1<<63 - 1), false},
	}
	for _, tt := range tests {
		got, ref := validity("validity_duration", tt.seconds)
		assert.Equal(t, tt.refused, ref != nil, "%d", tt.seconds)
		if ref == nil {
			assert.Equal(t, tt.want, got, "%d", tt.seconds)
		}
	}
}
