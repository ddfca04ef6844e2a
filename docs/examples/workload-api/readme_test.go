package main

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEShowsThisProgram keeps the README's copy of this program equal
// to it, so the example users copy is the one TestWorkloadAPIE2E runs.
func TestREADMEShowsThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	block := "```go\n" + string(src) + "```\n"
	if !strings.Contains(string(readme), block) {
		t.Fatalf("README.md does not show docs/examples/workload-api/main.go as it is; paste it into the \"SPIFFE Workload API and JWT-SVIDs\" section")
	}
}
