// Command fuzzreport runs the module's fuzz campaign (make fuzz) and
// records it in FUZZING.md: for every fuzz target, the command, how long
// it ran, how many inputs it executed and whether it found a crasher.
//
// `go test -fuzz` ends with a line giving the rate of its last interval,
// which may read "(0/sec)" though the run executed hundreds of thousands
// of inputs; what is recorded is the largest cumulative execs count the
// run printed, which is what the campaign is judged by.
//
// Each target's result is appended to a TSV file (-results) as soon as it
// ends, and FUZZING.md is rendered from that file after every target, so
// an interrupted campaign keeps what it measured:
//
//   - without -resume and -run, a campaign starts a new results file, so
//     FUZZING.md records that one campaign;
//   - -resume goes on from the file: a target whose latest result there is
//     ok for the same duration is skipped, a failed one runs again;
//   - -run REGEXP without -resume fuzzes the matching targets again and
//     appends, their new results replacing the old in FUZZING.md.
//
// The exit status is 1 if any target of this campaign (those -run
// matches) has a failed latest result, whether this run or, resumed, an
// earlier one recorded it.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	var c campaign
	flag.DurationVar(&c.short, "time", time.Minute, "how long each fuzz target runs")
	flag.DurationVar(&c.long, "longtime", 10*time.Minute, "how long each target listed in -long runs")
	flag.StringVar(&c.longFile, "long", "internal/testkit/fuzzreport/long.txt", "file listing `package target` pairs that run for -longtime")
	flag.IntVar(&c.parallel, "parallel", runtime.NumCPU(), "fuzzing workers per target (go test -parallel)")
	flag.DurationVar(&c.minimize, "minimizetime", 5*time.Second, "go test -fuzzminimizetime")
	flag.StringVar(&c.results, "results", "bin/fuzz/results.tsv", "TSV file each target's result is appended to (emptied first unless -resume or -run)")
	flag.StringVar(&c.out, "out", "FUZZING.md", "report to write")
	flag.StringVar(&c.only, "run", "", "regexp: only targets whose `package.Target` matches")
	flag.BoolVar(&c.resume, "resume", false, "go on from -results: skip targets it records ok with the same duration (without it, and without -run, -results starts anew)")
	flag.BoolVar(&c.reportOnly, "report", false, "only render -out from -results")
	flag.StringVar(&c.cmdline, "cmd", "make fuzz", "command recorded in the report")
	flag.StringVar(&c.notes, "notes", "", "markdown `file` appended to the report (what the campaigns found and what was done about it)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := c.run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "fuzzreport:", err)
		os.Exit(1)
	}
}

type campaign struct {
	short, long, minimize time.Duration
	longFile, results     string
	out, only, cmdline    string
	notes                 string
	parallel              int
	resume, reportOnly    bool
}

// target is one fuzz target of one package.
type target struct{ pkg, name string }

func (t target) String() string { return t.pkg + "." + t.name }

// result is one line of the results file.
type result struct {
	target
	fuzztime time.Duration
	execs    int64
	elapsed  time.Duration
	ok       bool
	detail   string // the first failure line, or the corpus growth
	ended    time.Time
}

func (c *campaign) run(ctx context.Context) error {
	if c.reportOnly {
		return c.render()
	}
	jobs, err := c.plan(ctx)
	if err != nil {
		return err
	}
	recorded, err := c.openResults()
	if err != nil {
		return err
	}
	for _, j := range toRun(jobs, recorded) {
		r := c.fuzz(ctx, j.target, j.fuzztime)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fmt.Printf("== %s %s: %d execs in %s, %s\n", j.target, j.fuzztime, r.execs, r.elapsed.Round(time.Second), status(r))
		if err := appendResult(c.results, r); err != nil {
			return err
		}
		if err := c.render(); err != nil {
			return err
		}
	}
	if recorded, err = readResults(c.results); err != nil {
		return err
	}
	if failed := failures(jobs, recorded); failed > 0 {
		return fmt.Errorf("%d fuzz targets failed; see %s", failed, c.out)
	}
	return nil
}

// plan lists the campaign's jobs: the module's fuzz targets -run matches,
// each with its duration.
func (c *campaign) plan(ctx context.Context) ([]job, error) {
	long, err := readLong(c.longFile)
	if err != nil {
		return nil, err
	}
	targets, err := listTargets(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkLong(long, targets); err != nil {
		return nil, err
	}
	var only *regexp.Regexp
	if c.only != "" {
		if only, err = regexp.Compile(c.only); err != nil {
			return nil, fmt.Errorf("-run: %w", err)
		}
	}
	return c.jobs(targets, long, only), nil
}

// openResults returns the results a resumed campaign goes on from, and
// empties the file for a fresh one (after the plan, so a bad flag or long
// list does not lose the last campaign's record).
func (c *campaign) openResults() ([]result, error) {
	switch {
	case c.resume:
		return readResults(c.results)
	case freshStart(c.resume, c.only):
		return nil, startResults(c.results)
	}
	return nil, nil
}

// job is a target of the campaign and how long it is fuzzed for.
type job struct {
	target
	fuzztime time.Duration
}

// jobs are the targets only matches (all with nil), each with its
// duration.
func (c *campaign) jobs(targets []target, long map[target]bool, only *regexp.Regexp) []job {
	var out []job
	for _, t := range targets {
		if only != nil && !only.MatchString(t.String()) {
			continue
		}
		d := c.short
		if long[t] {
			d = c.long
		}
		out = append(out, job{t, d})
	}
	return out
}

// freshStart says whether a campaign starts a new results file, so that
// FUZZING.md records one campaign: not when it resumes one, nor when -run
// re-fuzzes some targets of the last.
func freshStart(resume bool, only string) bool {
	return !resume && only == ""
}

// toRun is what a campaign of jobs fuzzes given the results recorded
// before it (those of the campaign it resumes, else none): every job but
// those whose latest result is ok for the same duration. A failed one
// runs again, so a crasher is never left behind by resuming.
func toRun(jobs []job, recorded []result) []job {
	ok := map[job]bool{}
	for _, r := range recorded {
		ok[job{r.target, r.fuzztime}] = r.ok
	}
	var out []job
	for _, j := range jobs {
		if !ok[j] {
			out = append(out, j)
		}
	}
	return out
}

// failures counts the jobs whose latest recorded result failed, whether
// recorded by this run or, resumed, by an earlier one: the exit status
// says what FUZZING.md says of the campaign's targets.
func failures(jobs []job, recorded []result) int {
	failed := map[target]bool{}
	for _, r := range recorded {
		failed[r.target] = !r.ok
	}
	n := 0
	for _, j := range jobs {
		if failed[j.target] {
			n++
		}
	}
	return n
}

// fuzz runs one target, echoing go test's output.
func (c *campaign) fuzz(ctx context.Context, t target, d time.Duration) result {
	args := []string{"test", "-run=^$", "-fuzz=^" + t.name + "$", "-fuzztime=" + d.String(),
		"-fuzzminimizetime=" + c.minimize.String(), "-parallel=" + strconv.Itoa(c.parallel), t.pkg}
	fmt.Printf("== go %s\n", strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, "go", args...)
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(os.Stdout, &out)
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	err := cmd.Run()
	r := parseOutput(out.String())
	r.target, r.fuzztime, r.elapsed, r.ended = t, d, time.Since(start), time.Now().UTC()
	if err != nil {
		r.ok = false
		if r.detail == "" {
			r.detail = err.Error()
		}
	}
	return r
}

var execsRE = regexp.MustCompile(`execs: (\d+) \(`)
var interestingRE = regexp.MustCompile(`new interesting: (\d+) \(total: (\d+)\)`)

// parseOutput reads go test -fuzz's output: the largest cumulative execs
// count, the corpus it ended with, and whether it passed.
func parseOutput(s string) result {
	r := result{ok: true}
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := execsRE.FindStringSubmatch(line); m != nil {
			if n, err := strconv.ParseInt(m[1], 10, 64); err == nil && n > r.execs {
				r.execs = n
			}
		}
		if m := interestingRE.FindStringSubmatch(line); m != nil {
			r.detail = "corpus " + m[2] + " (" + m[1] + " new)"
		}
		if strings.HasPrefix(line, "--- FAIL") || strings.HasPrefix(line, "FAIL") || strings.Contains(line, "Failing input written to") {
			if r.ok {
				r.detail = strings.TrimSpace(line)
			} else if strings.Contains(line, "Failing input written to") {
				r.detail += "; " + strings.TrimSpace(line)
			}
			r.ok = false
		}
	}
	return r
}

// listTargets finds every fuzz target of the module from the source of
// each package's test files (go test -list would compile every test
// binary first).
func listTargets(ctx context.Context) ([]target, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{join .TestGoFiles \" \"}} {{join .XTestGoFiles \" \"}}", "./...").Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	var targets []target
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(line, "\t", 3)
		if len(f) != 3 {
			return nil, fmt.Errorf("go list: unexpected line %q", line)
		}
		for _, file := range strings.Fields(f[2]) {
			src, err := os.ReadFile(filepath.Join(f[1], file))
			if err != nil {
				return nil, err
			}
			for _, name := range fuzzTargets(string(src)) {
				targets = append(targets, target{f[0], name})
			}
		}
	}
	return targets, nil
}

var fuzzFuncRE = regexp.MustCompile(`(?m)^func (Fuzz\w*)\(\w+ \*testing\.F\)`)

// fuzzTargets returns the fuzz targets a test file declares.
func fuzzTargets(src string) []string {
	var names []string
	for _, m := range fuzzFuncRE.FindAllStringSubmatch(src, -1) {
		names = append(names, m[1])
	}
	return names
}

// readLong reads the targets that run for -longtime: one `package
// Target` per line, # comments.
func readLong(path string) (map[target]bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	long := map[target]bool{}
	for i, line := range strings.Split(string(data), "\n") {
		if j := strings.IndexByte(line, '#'); j >= 0 {
			line = line[:j]
		}
		f := strings.Fields(line)
		switch len(f) {
		case 0:
		case 2:
			long[target{f[0], f[1]}] = true
		default:
			return nil, fmt.Errorf("%s:%d: want `package Target`, got %q", path, i+1, line)
		}
	}
	return long, nil
}

// checkLong refuses a long list naming a target that does not exist, so a
// renamed target cannot silently drop to the short time.
func checkLong(long map[target]bool, targets []target) error {
	for t := range long {
		if !slices.Contains(targets, t) {
			return fmt.Errorf("long list names %s, which is not a fuzz target of this module", t)
		}
	}
	return nil
}

func status(r result) string {
	if r.ok {
		return "ok"
	}
	return "FAILED: " + r.detail
}

// startResults empties the results file, creating it if need be.
func startResults(path string) error {
	if err := os.MkdirAll(dirOf(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, nil, 0o644)
}

func appendResult(path string, r result) error {
	if err := os.MkdirAll(dirOf(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%s\t%s\t%s\t%d\t%s\t%t\t%s\t%s\n", r.pkg, r.name, r.fuzztime, r.execs,
		r.elapsed.Round(time.Second), r.ok, strings.ReplaceAll(r.detail, "\t", " "), r.ended.Format(time.RFC3339))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func dirOf(path string) string {
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		return path[:i]
	}
	return "."
}

// readResults reads the results file; a later line for the same target
// replaces an earlier one.
func readResults(path string) ([]result, error) {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rs []result
	index := map[target]int{}
	for i, line := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
		if line == "" {
			continue
		}
		r, err := parseResult(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, i+1, err)
		}
		if j, ok := index[r.target]; ok {
			rs[j] = r
			continue
		}
		index[r.target] = len(rs)
		rs = append(rs, r)
	}
	return rs, nil
}

func parseResult(line string) (result, error) {
	f := strings.Split(line, "\t")
	if len(f) != 8 {
		return result{}, fmt.Errorf("want 8 fields, got %d", len(f))
	}
	var r result
	var err error
	r.target = target{f[0], f[1]}
	if r.fuzztime, err = time.ParseDuration(f[2]); err != nil {
		return result{}, err
	}
	if r.execs, err = strconv.ParseInt(f[3], 10, 64); err != nil {
		return result{}, err
	}
	if r.elapsed, err = time.ParseDuration(f[4]); err != nil {
		return result{}, err
	}
	if r.ok, err = strconv.ParseBool(f[5]); err != nil {
		return result{}, err
	}
	r.detail = f[6]
	if r.ended, err = time.Parse(time.RFC3339, f[7]); err != nil {
		return result{}, err
	}
	return r, nil
}

func (c *campaign) render() error {
	rs, err := readResults(c.results)
	if err != nil {
		return err
	}
	report := render(rs, c, environment())
	if c.notes != "" {
		extra, err := os.ReadFile(c.notes)
		if err != nil {
			return err
		}
		report += "\n" + string(extra)
	}
	return os.WriteFile(c.out, []byte(report), 0o644)
}

func environment() string {
	v, _ := exec.Command("go", "version").Output()
	commit, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	return fmt.Sprintf("%s, %d CPUs, commit %s", strings.TrimSpace(string(v)), runtime.NumCPU(), strings.TrimSpace(string(commit)))
}

func render(rs []result, c *campaign, env string) string {
	var b strings.Builder
	b.WriteString("# Fuzzing\n\n")
	b.WriteString("Every parser of untrusted input has a fuzz target (`go test -fuzz`); their seed corpora run\n")
	b.WriteString("in `make test`. This file records the last campaign, written by `internal/testkit/fuzzreport`.\n\n")
	fmt.Fprintf(&b, "Command: `%s` (each target `go test -run='^$' -fuzz='^Target$' -fuzztime=T -parallel=%d PKG`;\n", c.cmdline, c.parallel)
	fmt.Fprintf(&b, "T is %s, or %s for the targets listed in `%s`: parsers added since the\n", c.short, c.long, c.longFile)
	b.WriteString("previous campaign). Execs is the cumulative count go test printed, not the last interval's rate.\n\n")
	fmt.Fprintf(&b, "Machine: %s.\n\n", env)
	var total int64
	failed := 0
	for _, r := range rs {
		total += r.execs
		if !r.ok {
			failed++
		}
	}
	fmt.Fprintf(&b, "%d targets, %d execs in all, %d failed.\n\n", len(rs), total, failed)
	b.WriteString("| package | target | fuzztime | execs | execs/s | result | ended (UTC) |\n")
	b.WriteString("|---|---|---|---:|---:|---|---|\n")
	for _, r := range rs {
		rate := int64(0)
		if s := r.fuzztime.Seconds(); s > 0 {
			rate = int64(float64(r.execs) / s)
		}
		res := "ok"
		if !r.ok {
			res = "**FAILED** " + r.detail
		} else if r.detail != "" {
			res = "ok, " + r.detail
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %d | %d | %s | %s |\n", strings.TrimPrefix(r.pkg, "github.com/trustbridge/trustbridge/"),
			r.name, r.fuzztime, r.execs, rate, strings.ReplaceAll(res, "|", "\\|"), r.ended.Format("2006-01-02 15:04"))
	}
	return b.String()
}
