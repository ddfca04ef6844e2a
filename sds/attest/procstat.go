package attest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
)

// maxStatSize bounds /proc/<pid>/stat: about 52 numbers and a command name
// of at most 64 bytes fit in well under 1 KiB.
const maxStatSize = 4 << 10

// procStat is what the pid reuse guard needs from /proc/<pid>/stat.
type procStat struct {
	state byte
	// startTime is field 22, clock ticks after boot: with the pid it
	// names one process for the life of the machine.
	startTime uint64
}

// exited reports whether the process has exited but not been reaped
// (zombie or dead): its pid is still held, its identity is not.
func (s procStat) exited() bool { return s.state == 'Z' || s.state == 'X' || s.state == 'x' }

// parseStat parses /proc/<pid>/stat of process pid. The command name
// (field 2) is in parentheses but may itself hold spaces and parentheses,
// so the fields after it are found from the last ')'.
func parseStat(b []byte, pid int32) (procStat, error) {
	if len(b) > maxStatSize {
		return procStat{}, fmt.Errorf("stat is over %d bytes", maxStatSize)
	}
	open := bytes.IndexByte(b, '(')
	end := bytes.LastIndexByte(b, ')')
	if open < 1 || end < open {
		return procStat{}, errors.New("stat has no parenthesized command name")
	}
	if got := string(b[:open]); got != strconv.Itoa(int(pid))+" " {
		return procStat{}, fmt.Errorf("stat names pid %q, not %d", got, pid)
	}
	rest := b[end+1:]
	if len(rest) < 2 || rest[0] != ' ' {
		return procStat{}, errors.New("stat has no fields after the command name")
	}
	// Fields 3 (state) to 22 (starttime): index 19 after the name.
	fields := bytes.Split(bytes.TrimSuffix(rest[1:], []byte("\n")), []byte(" "))
	if len(fields) < 20 {
		return procStat{}, fmt.Errorf("stat has %d fields after the command name, want at least 20", len(fields))
	}
	if len(fields[0]) != 1 {
		return procStat{}, fmt.Errorf("stat state %q is not one letter", fields[0])
	}
	start, err := strconv.ParseUint(string(fields[19]), 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("stat start time: %w", err)
	}
	return procStat{state: fields[0][0], startTime: start}, nil
}

// readStat reads and parses <procRoot>/<pid>/stat.
func readStat(procRoot string, pid int32) (procStat, error) {
	b, err := readBounded(filepath.Join(procRoot, strconv.Itoa(int(pid)), "stat"), maxStatSize)
	if err != nil {
		return procStat{}, err
	}
	st, err := parseStat(b, pid)
	if err != nil {
		return procStat{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return st, nil
}

// readBounded reads a whole file of at most max bytes; a larger one is an
// error, not a truncated read.
func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is over %d bytes", path, max)
	}
	return b, nil
}
