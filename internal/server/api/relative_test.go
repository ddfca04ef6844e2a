package api

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestRelative(t *testing.T) {
	const day = 24 * time.Hour
	tests := []struct {
		d    time.Duration
		want string
	}{
		{0, "now"},
		{500 * time.Millisecond, "now"},
		{-999 * time.Millisecond, "now"},
		{30 * time.Second, "in 30s"},
		{-30 * time.Second, "30s ago"},
		{-5 * time.Minute, "5m ago"},
		{3*time.Hour + 12*time.Minute, "in 3h12m"},
		{-(72*time.Hour + 13*time.Minute + 4*time.Second), "3d ago"},
		{-47 * time.Hour, "47h ago"},
		{49 * time.Hour, "in 2d1h"},
		{-400 * day, "400d ago"},
		{3 * 365 * day, "in 3y"},
	}
	for _, tt := range tests {
		t.Run(tt.d.String(), func(t *testing.T) { assert.Equal(t, tt.want, Relative(tt.d)) })
	}
}
