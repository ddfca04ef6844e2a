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
	var indented []string
	for _, l := range strings.Split(strings.TrimRight(string(src), "\n"), "\n") {
		if l != "" {
			l = "  " + l
		}
		indented = append(indented, l)
	}
	block := "  ```go\n" + strings.Join(indented, "\n") + "\n  ```\n"
	if !strings.Contains(string(readme), block) {
		t.Fatalf("README.md does not show docs/examples/workload-api/main.go as it is; paste it (indented by two spaces) into the Workload API item")
	}
}
