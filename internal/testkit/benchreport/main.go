// Command benchreport turns `go test -bench` output into BENCHMARKS.md.
//
// Machines here are noisy, so absolute times are reported only for
// context: the figure that matters is each benchmark's ratio to its
// baseline, a sibling sub-benchmark whose last name element starts with
// "baseline" and that ran in the same process, interleaved with it.
// Medians over -count runs are used.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	in := flag.String("in", "", "go test -bench output")
	out := flag.String("out", "BENCHMARKS.md", "report to write")
	cmd := flag.String("cmd", "make bench", "command that produced the input, recorded in the report")
	notes := flag.String("notes", "", "markdown file appended to the report as its notes section")
	flag.Parse()
	f, err := os.Open(*in)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
	defer f.Close()
	res, meta, err := parse(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
	report := render(res, meta, *cmd, time.Now().UTC())
	if *notes != "" {
		extra, err := os.ReadFile(*notes)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			os.Exit(1)
		}
		report += "\n" + string(extra)
	}
	if err := os.WriteFile(*out, []byte(report), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
	fmt.Print(report)
}

type sample struct {
	ns, bytes, allocs float64
	// extra holds custom metrics from b.ReportMetric (p50-ns, p99-ns, ...).
	extra map[string]float64
}

type result struct {
	pkg, name string
	samples   []sample
}

// benchLine matches "BenchmarkX/y-2   123   456 ns/op ..." and captures the
// name and the value/unit pairs that follow the iteration count, in any
// order (custom metrics from b.ReportMetric sit between ns/op and B/op).
var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)

func parse(r io.Reader) ([]*result, map[string]string, error) {
	meta := map[string]string{}
	byKey := map[string]*result{}
	var order []*result
	pkg := ""
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		for _, k := range []string{"goos", "goarch", "cpu", "pkg"} {
			if v, ok := strings.CutPrefix(line, k+": "); ok {
				if k == "pkg" {
					pkg = v
				} else {
					meta[k] = v
				}
			}
		}
		m := benchLine.FindStringSubmatch(line)
		if m == nil || !strings.Contains(m[2], "ns/op") {
			continue
		}
		key := pkg + " " + m[1]
		res := byKey[key]
		if res == nil {
			res = &result{pkg: pkg, name: m[1]}
			byKey[key] = res
			order = append(order, res)
		}
		s := sample{}
		fields := strings.Fields(m[2])
		for i := 0; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				continue
			}
			switch fields[i+1] {
			case "ns/op":
				s.ns = v
			case "B/op":
				s.bytes = v
			case "allocs/op":
				s.allocs = v
			default:
				if s.extra == nil {
					s.extra = map[string]float64{}
				}
				s.extra[fields[i+1]] = v
			}
		}
		res.samples = append(res.samples, s)
	}
	if len(order) == 0 {
		return nil, nil, fmt.Errorf("no benchmark results in input")
	}
	return order, meta, sc.Err()
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func (r *result) med(field func(sample) float64) float64 {
	xs := make([]float64, len(r.samples))
	for i, s := range r.samples {
		xs[i] = field(s)
	}
	return median(xs)
}

// extras renders the median of each custom metric, sorted by name.
func (r *result) extras() string {
	names := map[string]bool{}
	for _, s := range r.samples {
		for k := range s.extra {
			names[k] = true
		}
	}
	keys := make([]string, 0, len(names))
	for k := range names {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.4g", k, r.med(func(s sample) float64 { return s.extra[k] })))
	}
	return strings.Join(parts, ", ")
}

func parent(name string) (string, string) {
	i := strings.LastIndex(name, "/")
	if i < 0 {
		return "", name
	}
	return name[:i], name[i+1:]
}

func render(res []*result, meta map[string]string, cmd string, now time.Time) string {
	baselines := map[string]*result{}
	for _, r := range res {
		if p, leaf := parent(r.name); strings.HasPrefix(leaf, "baseline") {
			baselines[r.pkg+" "+p] = r
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmarks\n\n")
	fmt.Fprintf(&b, "Produced by `%s` on %s (%s, %s/%s, %s).\n\n", cmd, now.Format("2006-01-02"), runtime.Version(), meta["goos"], meta["goarch"], meta["cpu"])
	b.WriteString("Each row is the median of the runs. **Ratio** is the row's median time over its\n")
	b.WriteString("baseline's (the `baseline:*` sibling, measured in the same run): below 1 is faster than\n")
	b.WriteString("the baseline. Absolute times are for context only; these machines are noisy.\n\n")
	b.WriteString("| package | benchmark | runs | ns/op | B/op | allocs/op | ratio | other metrics (median) |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---|\n")
	for _, r := range res {
		ratio := "—"
		p, leaf := parent(r.name)
		if base, ok := baselines[r.pkg+" "+p]; ok {
			if strings.HasPrefix(leaf, "baseline") {
				ratio = "1.00 (baseline)"
			} else if bn := base.med(func(s sample) float64 { return s.ns }); bn > 0 {
				ratio = fmt.Sprintf("%.2f", r.med(func(s sample) float64 { return s.ns })/bn)
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %.0f | %.0f | %.0f | %s | %s |\n",
			strings.TrimPrefix(r.pkg, "github.com/trustbridge/trustbridge/"), r.name, len(r.samples),
			r.med(func(s sample) float64 { return s.ns }), r.med(func(s sample) float64 { return s.bytes }),
			r.med(func(s sample) float64 { return s.allocs }), ratio, r.extras())
	}
	return b.String()
}
