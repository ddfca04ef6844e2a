package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The demo runs end to end against a freshly built binary and leaves
// nothing behind.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three servers")
	}
	bin := filepath.Join(t.TempDir(), "trustbridge")
	out, err := exec.Command("go", "build", "-o", bin, "../trustbridge").CombinedOutput()
	require.NoError(t, err, "%s", out)
	before, _ := filepath.Glob(filepath.Join(os.TempDir(), "trustbridge-demo-*"))

	var buf bytes.Buffer
	err = run(context.Background(), options{bin: bin}, &buf)
	t.Log(buf.String())
	require.NoError(t, err)
	for _, want := range []string{
		"west.example fetched east.example's bundle over https_spiffe",
		"east.example fetched west.example's bundle over https_web",
		"mTLS east.example/frontend → west.example/backend succeeded",
		"mTLS north.example/frontend → west.example/backend refused",
		"roots never cross trust domains",
	} {
		assert.Contains(t, buf.String(), want)
	}
	after, _ := filepath.Glob(filepath.Join(os.TempDir(), "trustbridge-demo-*"))
	assert.ElementsMatch(t, before, after, "the demo removes its temp dir")
	ps, _ := exec.Command("pgrep", "-f", bin+" server").Output()
	assert.Empty(t, strings.TrimSpace(string(ps)), "no server left running")
}

func TestDemoMissingBinary(t *testing.T) {
	err := run(context.Background(), options{bin: filepath.Join(t.TempDir(), "nope")}, &bytes.Buffer{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "make build")
}

// A server that does not start ends the demo with its log's tail, and
// nothing is left behind.
func TestDemoServerFails(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "trustbridge")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\necho 'cannot bind: address in use' >&2\nexit 3\n"), 0o755))
	var buf bytes.Buffer
	err := run(context.Background(), options{bin: bin}, &buf)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "east.example exited")
	assert.Contains(t, buf.String(), "last lines of east.example's log")
	assert.Contains(t, buf.String(), "cannot bind: address in use")
}
