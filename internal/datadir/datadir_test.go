package datadir

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseHolder(t *testing.T) {
	started := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, in string
		want     Holder
		err      string
	}{
		{name: "empty (released cleanly)", in: ""},
		{name: "blank", in: " \n"},
		{name: "record", in: `{"pid":42,"host":"h","started":"2026-11-24T10:00:00Z","command":"trustbridge server"}` + "\n",
			want: Holder{PID: 42, Host: "h", Started: started, Command: "trustbridge server"}},
		{name: "unknown field", in: `{"pid":42,"owner":"x"}`, err: "unknown field"},
		{name: "two records", in: `{"pid":1}{"pid":2}`, err: "data after the record"},
		{name: "negative pid", in: `{"pid":-1}`, err: "pid -1"},
		{name: "not JSON", in: "4242\n", err: "lock record"},
		{name: "too large", in: `{"pid":1,"command":"` + strings.Repeat("x", maxRecord) + `"}`, err: "exceeds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := ParseHolder([]byte(tc.in))
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				assert.Zero(t, h)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, h)
		})
	}
}

// ParseHolder reads what another process wrote: it never panics, and a
// record it accepts survives a round trip.
func FuzzParseHolder(f *testing.F) {
	f.Add([]byte(`{"pid":42,"host":"h","started":"2026-11-24T10:00:00Z","command":"trustbridge server"}`))
	f.Add([]byte(""))
	f.Add([]byte(`{"pid":-5}`))
	f.Add([]byte(`{"pid":1e99}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ParseHolder(data)
		if err != nil {
			return
		}
		assert.GreaterOrEqual(t, h.PID, 0)
		out, err := json.Marshal(h)
		require.NoError(t, err)
		again, err := ParseHolder(out)
		require.NoError(t, err)
		assert.True(t, h.Started.Equal(again.Started))
		h.Started, again.Started = time.Time{}, time.Time{}
		assert.Equal(t, h, again)
	})
}

func TestHolderString(t *testing.T) {
	h := Holder{PID: 42, Host: "db1", Started: time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC), Command: "trustbridge server"}
	assert.Equal(t, "pid 42 on host db1 (trustbridge server), started 2026-11-24T10:00:00Z", h.String())
	assert.Equal(t, "pid 7", Holder{PID: 7}.String())
	assert.Equal(t, "a process that has not recorded itself in the lock file", Holder{}.String())
}
