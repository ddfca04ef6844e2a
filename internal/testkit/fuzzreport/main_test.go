package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseOutput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		out    string
		execs  int64
		ok     bool
		detail string
	}{
		{"a pass whose last interval reads 0/sec", `fuzz: elapsed: 0s, gathering baseline coverage: 0/12 completed
fuzz: elapsed: 3s, execs: 40211 (13400/sec), new interesting: 2 (total: 14)
fuzz: elapsed: 57s, execs: 242531 (4100/sec), new interesting: 5 (total: 17)
fuzz: elapsed: 1m0s, execs: 242531 (0/sec), new interesting: 5 (total: 17)
PASS
ok  	example/pkg	61.2s`, 242531, true, "corpus 17 (5 new)"},
		{"a crasher", `fuzz: elapsed: 3s, execs: 1000 (333/sec), new interesting: 0 (total: 3)
--- FAIL: FuzzX (3.10s)
    --- FAIL: FuzzX (0.00s)
        x_test.go:12: boom

    Failing input written to testdata/fuzz/FuzzX/abc
    To re-run:
    go test -run=FuzzX/abc
FAIL
exit status 1`, 1000, false, "--- FAIL: FuzzX (3.10s); Failing input written to testdata/fuzz/FuzzX/abc"},
		{"a build failure", "# example/pkg\n./x.go:1: syntax error\nFAIL\texample/pkg [build failed]", 0, false, "FAIL\texample/pkg [build failed]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := parseOutput(tt.out)
			assert.Equal(t, tt.execs, r.execs)
			assert.Equal(t, tt.ok, r.ok)
			assert.Equal(t, tt.detail, r.detail)
		})
	}
}

func TestFuzzTargets(t *testing.T) {
	t.Parallel()
	src := "package x\n\nfunc FuzzA(f *testing.F) {}\nfunc FuzzB(ff *testing.F) {\n}\nfunc FuzzNot(t *testing.T) {}\n// func FuzzC(f *testing.F)\nfunc helperFuzz(f *testing.F) {}\n"
	assert.Equal(t, []string{"FuzzA", "FuzzB"}, fuzzTargets(src))
}

func TestResultsRoundTripAndReport(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "r", "results.tsv")
	ended := time.Date(2026, 12, 6, 7, 0, 0, 0, time.UTC)
	a := result{target: target{"github.com/trustbridge/trustbridge/internal/x", "FuzzA"}, fuzztime: time.Minute, execs: 100, elapsed: 62 * time.Second, ok: true, detail: "corpus 3 (1 new)", ended: ended}
	b := result{target: target{"github.com/trustbridge/trustbridge/internal/y", "FuzzB"}, fuzztime: 10 * time.Minute, execs: 6000, elapsed: 601 * time.Second, ok: false, detail: "--- FAIL: FuzzB | x", ended: ended}
	require.NoError(t, appendResult(path, a))
	require.NoError(t, appendResult(path, b))
	a.execs = 200 // a later run of the same target replaces the earlier
	require.NoError(t, appendResult(path, a))
	got, err := readResults(path)
	require.NoError(t, err)
	assert.Equal(t, []result{a, b}, got)

	md := render(got, &campaign{short: time.Minute, long: 10 * time.Minute, longFile: "long.txt", cmdline: "make fuzz", parallel: 2}, "go1.x, 2 CPUs")
	assert.Contains(t, md, "2 targets, 6200 execs in all, 1 failed.")
	assert.Contains(t, md, "| `internal/x` | FuzzA | 1m0s | 200 | 3 | ok, corpus 3 (1 new) | 2026-12-06 07:00 |")
	assert.Contains(t, md, `**FAILED** --- FAIL: FuzzB \| x`)
}

func TestReadLong(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	require.NoError(t, os.WriteFile(good, []byte("# c\n\npkg/a FuzzA # why\n"), 0o644))
	long, err := readLong(good)
	require.NoError(t, err)
	assert.Equal(t, map[target]bool{{"pkg/a", "FuzzA"}: true}, long)
	assert.ErrorContains(t, checkLong(long, []target{{"pkg/a", "FuzzB"}}), "long list names pkg/a.FuzzA, which is not a fuzz target")

	bad := filepath.Join(dir, "bad")
	require.NoError(t, os.WriteFile(bad, []byte("pkg/a\n"), 0o644))
	_, err = readLong(bad)
	assert.ErrorContains(t, err, strings.Join([]string{bad, "1"}, ":"))
}

// The long list in the repository names real targets (checked against
// the module at campaign start too; here without running go list).
func TestLongListNamesTargets(t *testing.T) {
	t.Parallel()
	long, err := readLong("long.txt")
	require.NoError(t, err)
	for tg := range long {
		dir := filepath.Join("..", "..", "..", strings.TrimPrefix(tg.pkg, "github.com/trustbridge/trustbridge/"))
		files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
		require.NoError(t, err)
		found := false
		for _, f := range files {
			data, err := os.ReadFile(f)
			require.NoError(t, err)
			found = found || strings.Contains(string(data), "func "+tg.name+"(f *testing.F)")
		}
		assert.True(t, found, "%s is listed in long.txt but not defined", tg)
	}
}

// TestCampaignDecisions: which jobs a campaign fuzzes given the results
// recorded before it (those it resumes, else none), and how many failed
// targets its exit status counts once this run's results are recorded.
func TestCampaignDecisions(t *testing.T) {
	t.Parallel()
	a, b, c := job{target{"p", "FuzzA"}, time.Minute}, job{target{"p", "FuzzB"}, time.Minute}, job{target{"q", "FuzzC"}, 10 * time.Minute}
	rec := func(j job, ok bool) result { return result{target: j.target, fuzztime: j.fuzztime, ok: ok} }
	tests := []struct {
		name     string
		jobs     []job
		recorded []result // before the run
		crashes  []job    // fail when this run fuzzes them
		run      []job
		failed   int
	}{
		{"fresh", []job{a, b, c}, nil, nil, []job{a, b, c}, 0},
		{"fresh, a crasher", []job{a, b, c}, nil, []job{b}, []job{a, b, c}, 1},
		{"resumed: ok ones skipped", []job{a, b, c}, []result{rec(a, true)}, nil, []job{b, c}, 0},
		{"resumed: a failed one runs again and still fails", []job{a, b, c}, []result{rec(a, true), rec(b, false)}, []job{b}, []job{b, c}, 1},
		{"resumed: a failed one runs again and passes", []job{a, b, c}, []result{rec(a, true), rec(b, false)}, nil, []job{b, c}, 0},
		{"resumed: everything recorded, one failed", []job{a, b}, []result{rec(a, true), rec(b, false)}, []job{b}, []job{b}, 1},
		{"resumed: ok for another duration runs again", []job{a, c}, []result{rec(a, true), rec(job{c.target, time.Minute}, true)}, nil, []job{c}, 0},
		{"resumed: a failure of a target outside the campaign (-run) is not counted", []job{a}, []result{rec(a, true), rec(b, false)}, nil, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			run := toRun(tt.jobs, tt.recorded)
			assert.Equal(t, tt.run, run)
			after := append([]result(nil), tt.recorded...)
			for _, j := range run {
				after = append(after, rec(j, !slices.Contains(tt.crashes, j)))
			}
			assert.Equal(t, tt.failed, failures(tt.jobs, latest(after)))
		})
	}
}

// latest is rs as readResults returns them: the last result of each
// target, in order of first appearance.
func latest(rs []result) []result {
	var out []result
	index := map[target]int{}
	for _, r := range rs {
		if i, ok := index[r.target]; ok {
			out[i] = r
			continue
		}
		index[r.target] = len(out)
		out = append(out, r)
	}
	return out
}

func TestFreshStart(t *testing.T) {
	t.Parallel()
	assert.True(t, freshStart(false, ""), "a new campaign: a new results file")
	assert.False(t, freshStart(true, ""), "-resume goes on from it")
	assert.False(t, freshStart(false, "FuzzA"), "-run re-fuzzes some targets of it")
	assert.False(t, freshStart(true, "FuzzA"))
}

// TestStartResults: a fresh campaign's results file holds none of the last
// campaign's lines.
func TestStartResults(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "r", "results.tsv")
	require.NoError(t, startResults(path), "the directory is created")
	require.NoError(t, appendResult(path, result{target: target{"p", "FuzzA"}, fuzztime: time.Minute, ok: true}))
	require.NoError(t, startResults(path))
	rs, err := readResults(path)
	require.NoError(t, err)
	assert.Empty(t, rs)
}

// The notes file is appended to the rendered report; a missing one is an
// error, not a report without it.
func TestRenderAppendsNotes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := &campaign{short: time.Minute, long: 10 * time.Minute, longFile: "long.txt", cmdline: "make fuzz", parallel: 1,
		results: filepath.Join(dir, "results.tsv"), out: filepath.Join(dir, "FUZZING.md"), notes: filepath.Join(dir, "NOTES.md")}
	require.NoError(t, appendResult(c.results, result{target: target{"p", "FuzzA"}, fuzztime: time.Minute, execs: 7, elapsed: time.Minute, ok: true, ended: time.Unix(0, 0)}))
	require.ErrorContains(t, c.render(), "NOTES.md")
	require.NoError(t, os.WriteFile(c.notes, []byte("## Notes\n\nA crasher, fixed.\n"), 0o644))
	require.NoError(t, c.render())
	out, err := os.ReadFile(c.out)
	require.NoError(t, err)
	assert.Contains(t, string(out), "| `p` | FuzzA | 1m0s | 7 |")
	assert.True(t, strings.HasSuffix(string(out), "\n## Notes\n\nA crasher, fixed.\n"))
}
