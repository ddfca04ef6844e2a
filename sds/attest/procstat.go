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

// maxStatusHead bounds how much of /proc/<pid>/status is read: its Uid:
// and Gid: lines come ninth and tenth, within a few hundred bytes (the
// Name: line before them holds at most 64 escaped bytes), while the whole
// file grows with the process's supplementary groups (Groups:, up to
// 65536 of them) and CPUs.
const maxStatusHead = 4 << 10

// procIDs are the effective IDs from /proc/<pid>/status.
type procIDs struct{ uid, gid uint32 }

// parseStatus returns the effective uid and gid in the head of a
// /proc/<pid>/status file: the second of the four IDs (real, effective,
// saved, filesystem) on its Uid: and Gid: lines. Only whole lines count
// (a head cut in the middle of one must not yield a shorter number), and
// each of the two must appear exactly once.
func parseStatus(b []byte) (procIDs, error) {
	if len(b) > maxStatusHead {
		return procIDs{}, fmt.Errorf("status head is over %d bytes", maxStatusHead)
	}
	var ids procIDs
	var seenUID, seenGID bool
	for {
		line, rest, ok := bytes.Cut(b, []byte("\n"))
		if !ok {
			break // not a whole line
		}
		b = rest
		key, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		var dst *uint32
		var seen *bool
		switch string(key) {
		case "Uid":
			dst, seen = &ids.uid, &seenUID
		case "Gid":
			dst, seen = &ids.gid, &seenGID
		default:
			continue
		}
		if *seen {
			return procIDs{}, fmt.Errorf("status has two %s: lines", key)
		}
		id, err := effectiveID(value)
		if err != nil {
			return procIDs{}, fmt.Errorf("status %s: line: %w", key, err)
		}
		*dst, *seen = id, true
	}
	if !seenUID || !seenGID {
		return procIDs{}, errors.New("status has no whole Uid: and Gid: lines")
	}
	return ids, nil
}

// effectiveID is the second of the four IDs of a status Uid: or Gid:
// line's value.
func effectiveID(value []byte) (uint32, error) {
	f := bytes.Fields(value)
	if len(f) != 4 {
		return 0, fmt.Errorf("%d IDs, want 4 (real, effective, saved, filesystem)", len(f))
	}
	id, err := strconv.ParseUint(string(f[1]), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("effective ID: %w", err)
	}
	return uint32(id), nil
}

// readStatusIDs reads the effective IDs of pid from the head of
// <procRoot>/<pid>/status.
func readStatusIDs(procRoot string, pid int32) (procIDs, error) {
	b, err := readHead(filepath.Join(procRoot, strconv.Itoa(int(pid)), "status"), maxStatusHead)
	if err != nil {
		return procIDs{}, err
	}
	ids, err := parseStatus(b)
	if err != nil {
		return procIDs{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return ids, nil
}

// readHead reads at most max bytes from the start of a file.
func readHead(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return b, nil
}
