//go:build unix

package main

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/datadir"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// serverProcess is `trustbridge server` in a process of its own: this
// test binary run as the CLI (cliEnv).
type serverProcess struct {
	cmd    *exec.Cmd
	admin  string
	stderr *testlog.Buffer
}

// startServerProcess starts a server process with args (logging JSON) and
// returns once it serves; the test's end kills it if it still runs. Every
// line it writes to standard error must be JSON with unique keys.
func startServerProcess(t *testing.T, args ...string) *serverProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"server"}, args...)...)
	cmd.Env = append(os.Environ(), cliEnv+"=1")
	p := &serverProcess{cmd: cmd, stderr: testlog.JSONLines(t)}
	cmd.Stdout = testlog.JSONLines(t)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		_, _ = p.stderr.Write(append(sc.Bytes(), '\n'))
		if rec := servertest.LogRecord(sc.Text(), "trustbridge server started"); rec != nil {
			p.admin, _ = rec["admin"].(string)
			p.admin = strings.TrimPrefix(p.admin, "http://")
			break
		}
	}
	require.NotEmpty(t, p.admin, "the server never logged its admin address; stderr:\n%s", p.stderr)
	go func() {
		for sc.Scan() {
			_, _ = p.stderr.Write(append(sc.Bytes(), '\n'))
		}
	}()
	return p
}

// kill crashes the server: SIGKILL, no clean-up of any kind.
func (p *serverProcess) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	_ = p.cmd.Wait()
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.Equal(t, syscall.SIGKILL, ws.Signal())
}

func mustReadFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return data
}

// One writer per data directory (issue 21 item 1): a second server on
// the directory of a running one fails at once, naming it, and changes
// nothing there; ca rotate still works beside it and says the running
// server publishes the root. When the first server crashes (SIGKILL), the
// lock goes with it: its lock file, still naming it, does not stop the
// next start, which finds the CA state and the audit log whole.
func TestSecondServerIsRefusedAndACrashFreesTheDataDir(t *testing.T) {
	dataDir := t.TempDir()
	args := []string{"--trust-domain", "example.org", "--data-dir", dataDir, "--admin-listen", "127.0.0.1:0", "--grpc-listen", "", "--log-format", "json"}
	first := startServerProcess(t, args...)
	pid := first.cmd.Process.Pid
	journal := mustReadFile(t, filepath.Join(dataDir, "ca", "state.json"))
	// The baseline entry follows the banner.
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		data, err := os.ReadFile(filepath.Join(dataDir, "audit.jsonl"))
		assert.NoError(c, err)
		assert.Contains(c, string(data), `"event":"baseline"`)
	}, time.Minute, 10*time.Millisecond)
	auditLog := mustReadFile(t, filepath.Join(dataDir, "audit.jsonl"))
	before := servertest.TrustOf(t, first.admin)

	_, stderr, code := runCLI(t, "", append([]string{"server"}, args...)...)
	assert.Equal(t, 1, code)
	host, _ := os.Hostname()
	assert.Contains(t, stderr, "--data-dir: "+dataDir+" is in use by another trustbridge: pid "+strconv.Itoa(pid)+" on host "+host+" (trustbridge server), started ")
	assert.Contains(t, stderr, "holds its lock "+filepath.Join(dataDir, datadir.LockName))
	assert.Contains(t, stderr, "stop that one first, or give this one a data directory of its own")
	assert.Equal(t, journal, mustReadFile(t, filepath.Join(dataDir, "ca", "state.json")), "the CA state is untouched")
	assert.Equal(t, auditLog, mustReadFile(t, filepath.Join(dataDir, "audit.jsonl")), "the audit log is untouched")
	code, _ = servertest.Get(t, "http://"+first.admin+"/healthz")
	assert.Equal(t, http.StatusOK, code, "the first server serves on")

	stdout, stderr, code := runCLIAt(t, time.Now, "", "ca", "rotate", "--data-dir", dataDir)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, fmt.Sprintf("; the server holding %s publishes it within 30s and activates it 5 refresh hints later; it is pid %d on host %s (trustbridge server), started ", dataDir, pid, host))

	first.kill(t)
	rec, err := datadir.ParseHolder(mustReadFile(t, filepath.Join(dataDir, datadir.LockName)))
	require.NoError(t, err)
	assert.Equal(t, pid, rec.PID, "the crashed server's record is still in the lock file")

	_, stderr, code = runCLI(t, "", "audit", "log", "verify", filepath.Join(dataDir, "audit.jsonl"))
	assert.Equal(t, 0, code, stderr)
	admin, _ := startServer(t, dataDir)
	after := servertest.TrustOf(t, admin)
	assert.Equal(t, before.Authorities[0].SHA256, after.Authorities[0].SHA256, "the same CA, not a new one")
	assert.Len(t, after.Authorities, 2, "with the root ca rotate prepared")
	rec, err = datadir.ParseHolder(mustReadFile(t, filepath.Join(dataDir, datadir.LockName)))
	require.NoError(t, err)
	assert.Equal(t, os.Getpid(), rec.PID, "the new server recorded itself")
}

// With no server on the data directory, ca rotate prepares the root and
// says it waits for one.
func TestCARotateSaysWhenNoServerRuns(t *testing.T) {
	dataDir := t.TempDir()
	_, _, stop := launchServer(t, baseServerOptions("example.org", dataDir))
	stop()
	stdout, stderr, code := runCLIAt(t, time.Now, "", "ca", "rotate", "--data-dir", dataDir)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "prepared root ")
	assert.Contains(t, stdout, "no server is running on "+dataDir+" now: the root is published when one starts there")
}

// An --audit-log outside the data directory has one writer too: a second
// server with its own data directory but the same audit log is refused,
// and the log stays whole.
func TestSecondServerOnOneAuditLogIsRefused(t *testing.T) {
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	withLog := func(o *server.Config) { o.AuditLog = auditPath }
	startServer(t, t.TempDir(), withLog)
	// The first server writes its baseline entry as it starts serving;
	// compare against the log once that entry is in.
	var before []byte
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		b, err := os.ReadFile(auditPath)
		if assert.NoError(c, err) && assert.Contains(c, string(b), `"event":"baseline"`) && assert.True(c, strings.HasSuffix(string(b), "\n")) {
			before = b
		}
	}, 10*time.Second, 10*time.Millisecond)

	o := baseServerOptions("example.org", t.TempDir())
	withLog(&o)
	err := serverError(t, o)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--audit-log: audit: "+auditPath+" is being appended to by another process")
	assert.Equal(t, before, mustReadFile(t, auditPath))
	_, stderr, code := runCLI(t, "", "audit", "log", "verify", auditPath)
	assert.Equal(t, 0, code, stderr)
}

// No silent new CA (issue 21 item 3): a --data-dir that does not exist
// is refused without --init, with the fix in the message, and nothing is
// created; with --init the first start creates it, and later starts,
// with or without --init (make run passes it every time), reuse its CA.
func TestServerRefusesAMissingDataDirWithoutInit(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "dta")
	_, stderr, code := runCLI(t, "", "server", "--trust-domain", "example.org", "--data-dir", dataDir, "--admin-listen", "127.0.0.1:0", "--grpc-listen", "")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "--data-dir "+dataDir+" does not exist, and starting there would create a new root CA")
	assert.Contains(t, stderr, "if the path is wrong, fix it; if this is the first start of this trust domain, pass --init (or create the directory empty: mkdir -m 700 "+dataDir+")")
	_, err := os.Stat(dataDir)
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing was created")

	var first servertest.TrustDoc
	for i, init := range []bool{true, true, false} {
		o := baseServerOptions("example.org", dataDir)
		o.Init = init
		admin, _, stop := launchServer(t, o)
		doc := servertest.TrustOf(t, admin)
		stop()
		if i == 0 {
			first = doc
			continue
		}
		assert.Equal(t, first.Authorities, doc.Authorities, "start %d (--init %v) reuses the CA", i+1, init)
	}
}

// A directory that exists and holds files but no CA state (a mistyped
// path to some other directory, or a data directory whose CA state was
// lost) is refused without --init and left as it was; an empty one, or
// one holding only a stale lock file, lost+found or the empty ca/ of a
// first start cut short, starts.
func TestServerRefusesADataDirWithOtherFilesWithoutInit(t *testing.T) {
	dataDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dataDir, "audit.jsonl"), nil, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dataDir, "notes.txt"), []byte("mine"), 0o600))
	o := baseServerOptions("example.org", dataDir)
	err := serverError(t, o)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--data-dir "+dataDir+" holds audit.jsonl, notes.txt but no CA state ("+filepath.Join(dataDir, "ca", "state.json")+")")
	assert.Contains(t, err.Error(), "if the CA state was lost, restore it from a backup; to start new CA state in this directory anyway, pass --init")
	entries, err := os.ReadDir(dataDir)
	require.NoError(t, err)
	assert.Len(t, entries, 2, "nothing written, not even a lock file")

	o.Init = true
	admin, _, stop := launchServer(t, o)
	assert.Len(t, servertest.TrustOf(t, admin).Authorities, 1)
	stop()
	assert.Equal(t, "mine", string(mustReadFile(t, filepath.Join(dataDir, "notes.txt"))))

	t.Run("with --ca-dir the message says what starts over", func(t *testing.T) {
		dataDir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dataDir, "x"), nil, 0o600))
		o := baseServerOptions("example.org", dataDir)
		o.CADir = writeCACerts(t)
		err := serverError(t, o)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "start the published roots' history and the bundle sequence over")
	})
	t.Run("leftovers of a first start cut short", func(t *testing.T) {
		dataDir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dataDir, datadir.LockName), []byte(`{"pid":1,"started":"2026-11-24T10:00:00Z"}`), 0o600))
		require.NoError(t, os.MkdirAll(filepath.Join(dataDir, "ca", "roots"), 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(dataDir, "ca", ".lock"), nil, 0o600))
		require.NoError(t, os.Mkdir(filepath.Join(dataDir, "lost+found"), 0o700))
		admin, _ := startServer(t, dataDir)
		assert.Len(t, servertest.TrustOf(t, admin).Authorities, 1)
	})
	t.Run("a server creating its first CA there is named instead", func(t *testing.T) {
		dataDir := t.TempDir()
		lock, err := datadir.Acquire(dataDir, datadir.Self("trustbridge server"))
		require.NoError(t, err)
		defer lock.Release()
		require.NoError(t, os.WriteFile(filepath.Join(dataDir, "audit.jsonl"), nil, 0o600))
		err = serverError(t, baseServerOptions("example.org", dataDir))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "is in use by another trustbridge: pid "+strconv.Itoa(os.Getpid()))
		assert.NotContains(t, err.Error(), "--init")
	})
	t.Run("root files without a journal are not a blank start", func(t *testing.T) {
		dataDir := t.TempDir()
		require.NoError(t, os.MkdirAll(filepath.Join(dataDir, "ca", "roots"), 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(dataDir, "ca", "roots", "1.key.pem"), nil, 0o600))
		err := serverError(t, baseServerOptions("example.org", dataDir))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "holds ca but no CA state")
		assert.True(t, strings.Contains(err.Error(), "pass --init"))
	})
}
