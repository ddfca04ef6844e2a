package attest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// statLine builds a /proc/<pid>/stat line with comm and the given state
// and start time (field 22), the other fields plausible numbers.
func statLine(pid, comm, state, start string) string {
	f := []string{pid, "(" + comm + ")", state}
	for i := 4; i <= 52; i++ {
		switch i {
		case 22:
			f = append(f, start)
		default:
			f = append(f, "0")
		}
	}
	return strings.Join(f, " ") + "\n"
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    procStat
		wantErr string
	}{
		{"plain", statLine("42", "sleep", "S", "123456"), procStat{state: 'S', startTime: 123456}, ""},
		{"comm with spaces", statLine("42", "my prog", "R", "7"), procStat{state: 'R', startTime: 7}, ""},
		{"comm with parentheses", statLine("42", "a) Z 1 (b", "S", "99"), procStat{state: 'S', startTime: 99}, ""},
		{"comm is a close paren", statLine("42", ")", "S", "5"), procStat{state: 'S', startTime: 5}, ""},
		{"zombie", statLine("42", "x", "Z", "5"), procStat{state: 'Z', startTime: 5}, ""},
		{"no newline", strings.TrimSuffix(statLine("42", "x", "S", "5"), "\n"), procStat{state: 'S', startTime: 5}, ""},
		{"other pid", statLine("43", "x", "S", "5"), procStat{}, "not 42"},
		{"no parens", "42 x S 1 2 3", procStat{}, "parenthesized"},
		{"nothing after comm", "42 (x)", procStat{}, "no fields"},
		{"too few fields", "42 (x) S 1 2 3\n", procStat{}, "fields"},
		{"bad start time", statLine("42", "x", "S", "-1"), procStat{}, "start time"},
		{"long state", statLine("42", "x", "SS", "1"), procStat{}, "one letter"},
		{"too large", "42 (" + strings.Repeat("x", maxStatSize) + ") S", procStat{}, "over"},
		{"empty", "", procStat{}, "parenthesized"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStat([]byte(tt.in), 42)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestExited(t *testing.T) {
	for _, s := range "ZXx" {
		assert.True(t, procStat{state: byte(s)}.exited(), string(s))
	}
	for _, s := range "RSDTtIWP" {
		assert.False(t, procStat{state: byte(s)}.exited(), string(s))
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add([]byte(statLine("42", "sleep", "S", "123456")), int32(42))
	f.Add([]byte(statLine("42", "a) Z 1 (b", "S", "99")), int32(42))
	f.Add([]byte("42 (x)"), int32(42))
	f.Add([]byte(""), int32(0))
	f.Fuzz(func(t *testing.T, b []byte, pid int32) {
		st, err := parseStat(b, pid)
		if err != nil {
			return
		}
		if st.state == 0 && len(b) > 0 {
			// A state byte of NUL is allowed only if the input has one.
			if !strings.Contains(string(b), "\x00") {
				t.Fatalf("accepted %q without a state", b)
			}
		}
	})
}
