package attest

import (
	"os"
	"strconv"
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

// statusHead builds the head of a /proc/<pid>/status file with the given
// Uid: and Gid: values, as the kernel writes them.
func statusHead(name, uid, gid string) string {
	return "Name:\t" + name + "\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t42\nNgid:\t0\nPid:\t42\nPPid:\t1\nTracerPid:\t0\n" +
		"Uid:\t" + uid + "\nGid:\t" + gid + "\nFDSize:\t64\nGroups:\t4 24 27 \n"
}

func TestParseStatus(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    procIDs
		wantErr string
	}{
		{"root", statusHead("sleep", "0\t0\t0\t0", "0\t0\t0\t0"), procIDs{}, ""},
		{"effective, not real", statusHead("sleep", "1000\t4242\t1000\t4242", "1000\t4343\t1000\t4343"), procIDs{uid: 4242, gid: 4343}, ""},
		{"largest", statusHead("x", "0\t4294967295\t0\t0", "0\t4294967294\t0\t0"), procIDs{uid: 4294967295, gid: 4294967294}, ""},
		{"spaces", statusHead("x", " 1  2 3 4 ", "5 6 7 8"), procIDs{uid: 2, gid: 6}, ""},
		{"name looks like Uid", statusHead("Uid:\t1\t1\t1\t1", "0\t7\t0\t0", "0\t8\t0\t0"), procIDs{uid: 7, gid: 8}, ""},
		{"head cut after Gid", strings.SplitAfter(statusHead("x", "0\t7\t0\t0", "0\t8\t0\t0"), "FDSize")[0], procIDs{uid: 7, gid: 8}, ""},
		{"head cut in Gid", strings.TrimSuffix(strings.Split(statusHead("x", "0\t7\t0\t0", "0\t81\t0\t0"), "\nFDSize")[0], "\t0\t0"), procIDs{}, "no whole"},
		{"no Gid", "Uid:\t0\t0\t0\t0\n", procIDs{}, "no whole"},
		{"no Uid", "Gid:\t0\t0\t0\t0\n", procIDs{}, "no whole"},
		{"two Uid", statusHead("x", "0\t0\t0\t0", "0\t0\t0\t0") + "Uid:\t1\t1\t1\t1\n", procIDs{}, "two Uid"},
		{"three IDs", statusHead("x", "0\t0\t0", "0\t0\t0\t0"), procIDs{}, "3 IDs"},
		{"negative", statusHead("x", "0\t-1\t0\t0", "0\t0\t0\t0"), procIDs{}, "effective ID"},
		{"over 32 bits", statusHead("x", "0\t4294967296\t0\t0", "0\t0\t0\t0"), procIDs{}, "effective ID"},
		{"too large", statusHead(strings.Repeat("x", maxStatusHead), "0\t0\t0\t0", "0\t0\t0\t0"), procIDs{}, "over"},
		{"empty", "", procIDs{}, "no whole"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStatus([]byte(tt.in))
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

// This process's status, read as PinPID reads it: its own effective IDs.
func TestReadStatusIDs(t *testing.T) {
	ids, err := readStatusIDs("/proc", int32(os.Getpid()))
	require.NoError(t, err)
	assert.Equal(t, procIDs{uid: uint32(os.Geteuid()), gid: uint32(os.Getegid())}, ids)
	_, err = readStatusIDs(t.TempDir(), 42)
	require.ErrorIs(t, err, os.ErrNotExist)
}

func FuzzParseStatus(f *testing.F) {
	f.Add([]byte(statusHead("sleep", "1000\t4242\t1000\t4242", "1000\t4343\t1000\t4343")))
	f.Add([]byte(statusHead("Uid:\t1\t1\t1\t1", "0\t7\t0\t0", "0\t8\t0\t0")))
	f.Add([]byte("Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		ids, err := parseStatus(b)
		if err != nil {
			return
		}
		// Accepted: the IDs are on whole lines of the input, as decimals.
		for _, id := range []uint32{ids.uid, ids.gid} {
			if !strings.Contains(string(b), strconv.FormatUint(uint64(id), 10)) {
				t.Fatalf("accepted %q with ID %d it does not hold", b, id)
			}
		}
		if !strings.Contains(string(b), "\n") {
			t.Fatalf("accepted %q without a whole line", b)
		}
	})
}
