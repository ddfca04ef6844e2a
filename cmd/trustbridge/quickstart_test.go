package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// TestQuickStartLeavesCheckoutClean runs the README's quick start as
// written, from a fresh copy of the repository: `make run`, then every
// command of the "in another terminal" block. Each must succeed, and the
// copy's `git status --porcelain` must be empty afterwards: the quick
// start writes a private key (demo-creds/key.pem), and `git add .` after
// it must never stage one. The fixed ports of the README are swapped for
// free ones (a developer's own `make run` may hold them).
func TestQuickStartLeavesCheckoutClean(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary in a copy of the repository and runs make run; skipped with -short")
	}
	for _, tool := range []string{"git", "make", "bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the README's quick start needs %s, which this machine lacks", tool)
		}
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	start, others := quickStart(t, string(readme))
	require.Contains(t, start, "make run", "the README's first block starts the server")

	dir := freshCopy(t, root)
	ports := map[string]string{
		"127.0.0.1:15014": servertest.ReservePort(t),
		"127.0.0.1:8443":  servertest.ReservePort(t),
		"127.0.0.1:15012": servertest.ReservePort(t),
	}
	runArgs := fmt.Sprintf("RUN_ARGS=--admin-listen %s --bundle-listen %s --grpc-listen %s",
		ports["127.0.0.1:15014"], ports["127.0.0.1:8443"], ports["127.0.0.1:15012"])
	stop := startMakeRun(t, dir, runArgs, ports["127.0.0.1:15014"])

	for _, line := range others {
		for from, to := range ports {
			line = strings.ReplaceAll(line, from, to)
		}
		cmd := exec.Command("bash", "-e", "-o", "pipefail", "-c", line)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "README quick start: %s\n%s", line, out)
	}
	stop()

	status, err := gitOutput(dir, "status", "--porcelain", "--untracked-files=all")
	require.NoError(t, err)
	require.Empty(t, status, "the quick start left files git would add (.gitignore must cover what it writes)")
	ignored, err := gitOutput(dir, "status", "--porcelain", "--ignored")
	require.NoError(t, err)
	require.Contains(t, ignored, "!! demo-creds/", "the quick start wrote no credentials: did the README change?")
}

// quickStart is the README's first ```sh block (starting the server) and
// the commands of the block after "in another terminal", continuation
// lines joined.
func quickStart(t *testing.T, readme string) (start string, commands []string) {
	t.Helper()
	var blocks [][]string
	var cur []string
	inBlock, afterTerminal, terminalBlock := false, false, -1
	sc := bufio.NewScanner(strings.NewReader(readme))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !inBlock && strings.HasPrefix(line, "```sh"):
			inBlock, cur = true, nil
		case inBlock && strings.HasPrefix(line, "```"):
			inBlock = false
			blocks = append(blocks, cur)
			if afterTerminal && terminalBlock < 0 {
				terminalBlock = len(blocks) - 1
			}
		case inBlock:
			cur = append(cur, line)
		case strings.Contains(line, "in another terminal"):
			afterTerminal = true
		}
	}
	require.NotEmpty(t, blocks, "README has no ```sh block")
	require.GreaterOrEqual(t, terminalBlock, 1, "README has no ```sh block after \"in another terminal\"")
	return strings.Join(blocks[0], "\n"), joinContinuations(blocks[terminalBlock])
}

func joinContinuations(lines []string) []string {
	var out []string
	var b strings.Builder
	for _, l := range lines {
		if s, ok := strings.CutSuffix(strings.TrimRight(l, " "), "\\"); ok {
			b.WriteString(s)
			continue
		}
		b.WriteString(l)
		if cmd := strings.TrimSpace(b.String()); cmd != "" {
			out = append(out, cmd)
		}
		b.Reset()
	}
	return out
}

// freshCopy copies the repository's tracked files (as they are in the
// working tree, so an uncommitted .gitignore counts) into a new git
// repository with them committed.
func freshCopy(t *testing.T, root string) string {
	t.Helper()
	files, err := gitOutput(root, "ls-files", "-z", "--cached")
	if err != nil {
		t.Skipf("the quick-start test copies a git checkout; %s is not one: %v", root, err)
	}
	dir := t.TempDir()
	for _, name := range strings.Split(strings.TrimRight(files, "\x00"), "\x00") {
		copyTracked(t, root, dir, name)
	}
	for _, args := range [][]string{
		{"init", "-q"},
		{"add", "-A"},
		{"-c", "user.name=quickstart", "-c", "user.email=quickstart@example.org", "commit", "-q", "--no-verify", "-m", "copy"},
	} {
		out, err := gitOutput(dir, args...)
		require.NoError(t, err, "git %v: %s", args, out)
	}
	return dir
}

func copyTracked(t *testing.T, root, dir, name string) {
	t.Helper()
	src := filepath.Join(root, name)
	fi, err := os.Lstat(src)
	if os.IsNotExist(err) {
		return // deleted in the working tree, not yet committed
	}
	require.NoError(t, err)
	dst := filepath.Join(dir, name)
	require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
	if fi.Mode()&os.ModeSymlink != 0 {
		target, err := os.Readlink(src)
		require.NoError(t, err)
		require.NoError(t, os.Symlink(target, dst))
		return
	}
	data, err := os.ReadFile(src)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(dst, data, fi.Mode().Perm()))
}

func gitOutput(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0")
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), fmt.Errorf("%w: %s", err, ee.Stderr)
	}
	return string(out), err
}

// startMakeRun runs `make run` in dir, as the README's first command, and
// waits until the server's /readyz on admin answers 200. stop sends it
// Ctrl-C (SIGINT to the process group) and waits for it to end.
func startMakeRun(t *testing.T, dir, runArgs, admin string) (stop func()) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command("make", "--no-print-directory", "run", runArgs)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(time.Minute):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
			t.Errorf("make run did not stop on Ctrl-C within a minute:\n%s", out.String())
		}
	}
	t.Cleanup(stop)

	// The build in the copy reuses the build cache; on a cold machine it
	// compiles everything, hence the generous bound.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for {
		if readyz(ctx, admin) {
			return stop
		}
		select {
		case err := <-done:
			t.Fatalf("make run ended before the server was ready (%v):\n%s", err, out.String())
		case <-ctx.Done():
			t.Fatalf("make run: the server was not ready within 10 minutes:\n%s", out.String())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func readyz(ctx context.Context, admin string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}
