package vaulttest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// trustbridgeBinary is the binary under test, from TRUSTBRIDGE_BIN.
func trustbridgeBinary(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("TRUSTBRIDGE_BIN")
	if bin == "" {
		if os.Getenv("TRUSTBRIDGE_VAULT_TESTS") == "require" {
			t.Fatal("TRUSTBRIDGE_VAULT_TESTS=require but TRUSTBRIDGE_BIN is unset: run make vault-tests")
		}
		t.Skip("TRUSTBRIDGE_BIN is unset: set it to a trustbridge binary (make build; bin/trustbridge) or run make vault-tests")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("TRUSTBRIDGE_BIN: %v", err)
	}
	abs, err := filepath.Abs(bin)
	require.NoError(t, err)
	return abs
}

// server is a running `trustbridge server`.
type server struct {
	adminAddr string
	grpcAddr  string
	bundleURL string
}

// startServer starts `bin server args...` and reads its listeners'
// addresses from its start-up records (it logs JSON, --log-format json):
// "trustbridge server started" names its listeners, and the bundle
// endpoint's record its URL. It is stopped (SIGTERM, then killed) when
// the test ends; every line it wrote, on stdout and stderr alike, must be
// a JSON object.
func startServer(t *testing.T, bin string, args ...string) *server {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"server"}, args...)...)
	logs, err := cmd.StderrPipe()
	require.NoError(t, err)
	stderr, stdout := &lockedBuffer{}, &lockedBuffer{}
	cmd.Stdout = stdout
	require.NoError(t, cmd.Start())

	done := make(chan struct{})
	addrs := make(chan *server, 1)
	started := false
	go func() {
		defer close(done)
		readStartRecords(io.TeeReader(logs, stderr), addrs)
		_, _ = io.Copy(stderr, logs)
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("trustbridge server did not stop within 15s of SIGTERM")
		}
		// One that did not start says why in plain text, as Fatalf shows.
		if !started {
			return
		}
		for name, b := range map[string]*lockedBuffer{"stdout": stdout, "stderr": stderr} {
			if line, ok := b.nonJSONLine(); !ok {
				t.Errorf("trustbridge server wrote a line that is not a JSON object on %s: %q", name, line)
			}
		}
		if t.Failed() {
			t.Logf("trustbridge server stderr:\n%s", stderr.String())
		}
	})

	select {
	case s := <-addrs:
		started = true
		return s
	case <-done:
		t.Fatalf("trustbridge server %v exited; stderr:\n%s", args, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("no start-up records naming the admin, gRPC and bundle listeners within 30s; stderr:\n%s", stderr.String())
	}
	return nil
}

// startRecord is what the start-up records say of the listeners.
type startRecord struct {
	Msg       string            `json:"msg"`
	Listeners map[string]string `json:"listeners"`
	URL       string            `json:"endpoint_url"`
}

// readStartRecords sends on ready, once, the server's admin and gRPC
// addresses and its bundle endpoint's URL as its JSON log lines name
// them; then it reads r to its end.
func readStartRecords(r io.Reader, ready chan<- *server) {
	s, sent := &server{}, false
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec startRecord
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			continue
		}
		switch rec.Msg {
		case "trustbridge server started":
			s.adminAddr, s.grpcAddr = rec.Listeners["admin"], rec.Listeners["grpc"]
		case "bundle endpoint: peers federate with this tuple":
			s.bundleURL = rec.URL
		}
		if !sent && s.adminAddr != "" && s.grpcAddr != "" && s.bundleURL != "" {
			ready <- s
			sent = true
		}
	}
}

// lockedBuffer collects a process's output for the test's log.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// nonJSONLine is the first non-empty line that is not a JSON object, and
// false, if there is one.
func (b *lockedBuffer) nonJSONLine() (string, bool) {
	for line := range strings.SplitSeq(b.String(), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var obj map[string]any
		if json.Unmarshal([]byte(line), &obj) != nil {
			return line, false
		}
	}
	return "", true
}

// runCLI runs a trustbridge command to completion, bounded in time, and
// returns its standard output.
func runCLI(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		require.NoError(t, err, "trustbridge %s\nstdout: %s\nstderr: %s", strings.Join(args, " "), stdout.Bytes(), stderr.Bytes())
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-waited
		t.Fatalf("trustbridge %s did not finish within 60s; stderr: %s", strings.Join(args, " "), stderr.Bytes())
	}
	return stdout.Bytes()
}
