package spiretest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// RequireEnv, when "require", makes a missing spire-server or spire-agent
// a failure.
const RequireEnv = "TRUSTBRIDGE_SPIRE_TESTS"

// BinEnv overrides where spire-server is looked for.
const BinEnv = "TRUSTBRIDGE_SPIRE_SERVER"

// AgentBinEnv overrides where spire-agent is looked for.
const AgentBinEnv = "TRUSTBRIDGE_SPIRE_AGENT"

// Config is what the server is started with.
type Config struct {
	TrustDomain string
	Federates   []Federation
	// NoSigningRateLimit turns SPIRE's per-IP signing rate limit off
	// (ratelimit { signing = false }); by default it is on, as SPIRE
	// ships: 500 X509-SVIDs and 500 JWT-SVIDs a second per caller IP on
	// the agent-facing SVID RPCs.
	NoSigningRateLimit bool
	// LogLevel is the server's log_level. Default "DEBUG", for the logs a
	// failed test prints; SPIRE ships with "INFO", which a measurement
	// should use (DEBUG logs a line per certificate signed).
	LogLevel string
}

// Federation is one federates_with entry, https_spiffe profile.
type Federation struct {
	TrustDomain      string
	URL              string
	EndpointSPIFFEID string
}

// Server is a running spire-server.
type Server struct {
	bin         string
	socket      string
	port        int
	pid         int
	trustDomain string
	logs        *testlog.Buffer
}

// Bundle is a federated bundle as SPIRE holds it.
type Bundle struct {
	TrustDomain string
	Sequence    uint64
	// X509Authorities are the DER certificates.
	X509Authorities [][]byte
}

// Bin is the spire-server binary: $TRUSTBRIDGE_SPIRE_SERVER, else
// bin/spire/spire-server at the top of the repository.
func Bin() string { return binPath(BinEnv, "spire-server") }

// binPath is $env, else bin/spire/<name> at the top of the repository.
func binPath(env, name string) string {
	if p := os.Getenv(env); p != "" {
		return p
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return ""
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "bin", "spire", name)
}

// requireBin skips the test when bin (the binary called name) is
// missing, or fails it under TRUSTBRIDGE_SPIRE_TESTS=require.
func requireBin(t testing.TB, env, name, bin string) {
	t.Helper()
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv(RequireEnv) == "require" {
			t.Fatalf("spiretest: %s required (%s=require) but missing: %v (run `make spire-tools`)", name, RequireEnv, err)
		}
		t.Skipf("spiretest: no %s (run `make spire-tools`, or set %s): %v", name, env, err)
	}
}

// RequireAgent skips the test when spire-agent is missing, or fails it
// under TRUSTBRIDGE_SPIRE_TESTS=require: for a test to call before it
// starts anything else.
func RequireAgent(t testing.TB) {
	t.Helper()
	requireBin(t, AgentBinEnv, "spire-agent", AgentBin())
}

// Start runs spire-server for cfg until the end of the test, and returns
// once its API answers. SPIRE needs an explicit port for its agent
// listener: Start takes one that was free a moment ago and tries again
// with another if SPIRE finds it taken.
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	bin := Bin()
	requireBin(t, BinEnv, "spire-server", bin)
	// A short directory: the API socket's path must fit in sun_path.
	dir, err := os.MkdirTemp("", "spire")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	var lastErr error
	for attempt := range 3 {
		s, err := start(t, bin, filepath.Join(dir, strconv.Itoa(attempt)), cfg)
		if err == nil {
			return s
		}
		lastErr = err
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	t.Fatalf("spiretest: %v", lastErr)
	return nil
}

func start(t testing.TB, bin, dir string, cfg Config) (*Server, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, socket: filepath.Join(dir, "api.sock"), port: port, trustDomain: cfg.TrustDomain, logs: &testlog.Buffer{}}
	conf := filepath.Join(dir, "server.conf")
	if err := os.WriteFile(conf, []byte(s.config(dir, port, cfg)), 0o600); err != nil {
		return nil, err
	}
	p, err := startProcess(s.logs, bin, "run", "-config", conf)
	if err != nil {
		return nil, err
	}
	s.pid = p.cmd.Process.Pid
	healthy := func() error { _, err := s.cli(nil, "healthcheck", "-shallow"); return err }
	if err := p.waitFor(60*time.Second, healthy); err != nil {
		p.stop()
		return nil, fmt.Errorf("spire-server did not start: %w\n%s", err, s.logs.String())
	}
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("spire-server log:\n%s", s.logs.String())
		}
	})
	return s, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// config is the server's HCL: loopback only, SQLite and in-memory keys,
// join tokens (for StartAgent), a new entry visible to agents within a
// second, the signing rate limit as cfg says, and one federates_with
// block per peer, https_spiffe.
func (s *Server) config(dir string, port int, cfg Config) string {
	logLevel := cfg.LogLevel
	if logLevel == "" {
		logLevel = "DEBUG"
	}
	var fed strings.Builder
	for _, f := range cfg.Federates {
		fmt.Fprintf(&fed, `
    federates_with %q {
      bundle_endpoint_url = %q
      bundle_endpoint_profile "https_spiffe" {
        endpoint_spiffe_id = %q
      }
    }`, f.TrustDomain, f.URL, f.EndpointSPIFFEID)
	}
	return fmt.Sprintf(`server {
  bind_address = "127.0.0.1"
  bind_port = "%d"
  socket_path = %q
  trust_domain = %q
  data_dir = %q
  log_level = %q
  ratelimit {
    signing = %t
  }
  federation {%s
  }
  experimental {
    # How often the entry cache agents sync from is reloaded (default 5s).
    cache_reload_interval = "1s"
  }
}

plugins {
  DataStore "sql" {
    plugin_data {
      database_type = "sqlite3"
      connection_string = %q
    }
  }
  KeyManager "memory" {
    plugin_data {}
  }
  NodeAttestor "join_token" {
    plugin_data {}
  }
}
`, port, s.socket, cfg.TrustDomain, filepath.Join(dir, "data"), logLevel, !cfg.NoSigningRateLimit, fed.String(),
		filepath.Join(dir, "datastore.sqlite3"))
}

// cli runs spire-server's CLI against this server's API socket.
func (s *Server) cli(stdin []byte, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.bin, append(args, "-socketPath", s.socket)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("spire-server %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// SetBundle stores doc, a SPIFFE bundle document, as td's bundle (the
// out-of-band bootstrap of https_spiffe).
func (s *Server) SetBundle(t testing.TB, td string, doc []byte) {
	t.Helper()
	if _, err := s.cli(doc, "bundle", "set", "-format", "spiffe", "-id", "spiffe://"+td); err != nil {
		t.Fatal(err)
	}
}

// Refresh has SPIRE fetch td's bundle from its endpoint now (federation
// refresh) and returns the bundle it then holds.
func (s *Server) Refresh(td string) (*Bundle, error) {
	if _, err := s.cli(nil, "federation", "refresh", "-id", td); err != nil {
		return nil, err
	}
	return s.FederatedBundle(td)
}

// FederatedBundle is the bundle SPIRE holds for td (bundle list).
func (s *Server) FederatedBundle(td string) (*Bundle, error) {
	out, err := s.cli(nil, "bundle", "list", "-id", "spiffe://"+td, "-output", "json")
	if err != nil {
		return nil, err
	}
	return parseBundle(out)
}

// parseBundle reads the JSON of spire-server bundle list -output json: the
// API's Bundle message, uint64 as a string (protojson), DER in base64.
func parseBundle(out string) (*Bundle, error) {
	var raw struct {
		TrustDomain     string `json:"trust_domain"`
		SequenceNumber  string `json:"sequence_number"`
		X509Authorities []struct {
			ASN1 string `json:"asn1"`
		} `json:"x509_authorities"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		return nil, fmt.Errorf("bundle list output: %w: %s", err, out)
	}
	b := &Bundle{TrustDomain: raw.TrustDomain}
	if raw.SequenceNumber != "" {
		seq, err := strconv.ParseUint(raw.SequenceNumber, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bundle list sequence_number %q: %w", raw.SequenceNumber, err)
		}
		b.Sequence = seq
	}
	for _, a := range raw.X509Authorities {
		der, err := base64.StdEncoding.DecodeString(a.ASN1)
		if err != nil {
			return nil, fmt.Errorf("bundle list x509 authority: %w", err)
		}
		b.X509Authorities = append(b.X509Authorities, der)
	}
	return b, nil
}

// Logs is what the server logged so far.
func (s *Server) Logs() string { return s.logs.String() }

// PID is the spire-server process, for its CPU time and memory in /proc.
func (s *Server) PID() int { return s.pid }

// Addr is the server's TCP listener (host:port), where agents attest and
// ask for SVIDs over mTLS.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }
