package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const sampleOutput = `goos: linux
goarch: amd64
pkg: github.com/trustbridge/trustbridge/internal/bundledoc
cpu: Test CPU
BenchmarkParse/a.json/baseline:go-spiffe-2         	   100	     1000 ns/op	     500 B/op	      10 allocs/op
BenchmarkParse/a.json/bundledoc-2                  	   100	     1500 ns/op	     700 B/op	      12 allocs/op
BenchmarkParse/a.json/baseline:go-spiffe-2         	   100	     3000 ns/op	     500 B/op	      10 allocs/op
BenchmarkParse/a.json/bundledoc-2                  	   100	     4500 ns/op	     700 B/op	      12 allocs/op
BenchmarkParse/a.json/baseline:go-spiffe-2         	   100	     2000 ns/op	     500 B/op	      10 allocs/op
BenchmarkParse/a.json/bundledoc-2                  	   100	     3000 ns/op	     700 B/op	      12 allocs/op
BenchmarkLonely-2                                  	   100	       10 ns/op
BenchmarkCustom-2                                  	   100	       20 ns/op	  15.00 p50-ns	  30.00 p99-ns	     64 B/op	       2 allocs/op
PASS
`

func TestReportRatiosAgainstSameRunBaseline(t *testing.T) {
	res, meta, err := parse(strings.NewReader(sampleOutput))
	require.NoError(t, err)
	require.Len(t, res, 4)
	out := render(res, meta, "make bench", time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC))
	assert.Contains(t, out, "`make bench` on 2026-01-02")
	assert.Contains(t, out, "| internal/bundledoc | BenchmarkParse/a.json/bundledoc | 3 | 3000 | 700 | 12 | 1.50 |  |")
	assert.Contains(t, out, "| BenchmarkParse/a.json/baseline:go-spiffe | 3 | 2000 | 500 | 10 | 1.00 (baseline) |  |")
	assert.Contains(t, out, "| BenchmarkLonely | 1 | 10 | 0 | 0 | — |  |")
	assert.Contains(t, out, "| BenchmarkCustom | 1 | 20 | 64 | 2 | — | p50-ns 15, p99-ns 30 |", "custom metrics between ns/op and B/op")
}

func TestReportRefusesEmptyInput(t *testing.T) {
	_, _, err := parse(strings.NewReader("PASS\n"))
	assert.Error(t, err)
}
