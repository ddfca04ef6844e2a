package spiretest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// AgentConfig is what StartAgent runs spire-agent with; zero values take
// the defaults given.
type AgentConfig struct {
	// DefaultSVIDName is sds.default_svid_name, the resource holding the
	// caller's first X509-SVID. Default "default".
	DefaultSVIDName string
	// DefaultBundleName is sds.default_bundle_name, the resource holding
	// the local trust domain's roots only. Default "null", as Istio's and
	// OpenShift's SPIRE integrations set it: when it equals
	// DefaultAllBundlesName, SPIRE 1.13.3 serves that name from this
	// setting (local roots only) and ignores default_all_bundles_name.
	DefaultBundleName string
	// DefaultAllBundlesName is sds.default_all_bundles_name, the resource
	// holding every trust domain the caller's entries federate with, as
	// Envoy's SPIFFE validator. Default "ROOTCA", the name Istio's agent
	// hands Envoy.
	DefaultAllBundlesName string
	// SyncInterval is how often the agent asks the server for its entries
	// (experimental.sync_interval). Default one second, so that a new
	// entry reaches the agent within a test's patience.
	SyncInterval time.Duration
}

func (c AgentConfig) withDefaults() AgentConfig {
	if c.DefaultSVIDName == "" {
		c.DefaultSVIDName = "default"
	}
	if c.DefaultBundleName == "" {
		c.DefaultBundleName = "null"
	}
	if c.DefaultAllBundlesName == "" {
		c.DefaultAllBundlesName = "ROOTCA"
	}
	if c.SyncInterval == 0 {
		c.SyncInterval = time.Second
	}
	return c
}

// Agent is a running spire-agent, attested to a Server.
type Agent struct {
	server *Server
	bin    string
	id     string
	socket string
	logs   *testlog.Buffer
}

// AgentBin is the spire-agent binary: $TRUSTBRIDGE_SPIRE_AGENT, else
// bin/spire/spire-agent at the top of the repository.
func AgentBin() string { return binPath(AgentBinEnv, "spire-agent") }

// StartAgent runs spire-agent against s until the end of the test, and
// returns once its Workload API (which serves SDS too) answers. The agent
// attests with a fresh join token and trusts the roots s holds now.
func (s *Server) StartAgent(t testing.TB, cfg AgentConfig) *Agent {
	t.Helper()
	RequireAgent(t)
	bin := AgentBin()
	// A short directory: the socket's path must fit in sun_path.
	dir, err := os.MkdirTemp("", "spa")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	a, err := s.startAgent(t, bin, dir, cfg.withDefaults())
	if err != nil {
		t.Fatalf("spiretest: %v", err)
	}
	return a
}

func (s *Server) startAgent(t testing.TB, bin, dir string, cfg AgentConfig) (*Agent, error) {
	token, id, err := s.joinToken()
	if err != nil {
		return nil, err
	}
	roots, err := s.localBundlePEM()
	if err != nil {
		return nil, err
	}
	bundlePath := filepath.Join(dir, "bundle.pem")
	if err := os.WriteFile(bundlePath, roots, 0o600); err != nil {
		return nil, err
	}
	a := &Agent{server: s, bin: bin, id: id, socket: filepath.Join(dir, "api.sock"), logs: &testlog.Buffer{}}
	conf := filepath.Join(dir, "agent.conf")
	if err := os.WriteFile(conf, []byte(a.config(dir, bundlePath, token, cfg)), 0o600); err != nil {
		return nil, err
	}
	p, err := startProcess(a.logs, bin, "run", "-config", conf)
	if err != nil {
		return nil, err
	}
	if err := p.waitFor(60*time.Second, a.healthy); err != nil {
		p.stop()
		return nil, fmt.Errorf("spire-agent did not start: %w\n%s", err, a.logs.String())
	}
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("spire-agent log:\n%s", a.logs.String())
		}
	})
	return a, nil
}

// config is the agent's HCL: join token attestation, in-memory keys, the
// unix workload attestor, and the SDS names of cfg.
func (a *Agent) config(dir, bundlePath, token string, cfg AgentConfig) string {
	return fmt.Sprintf(`agent {
  data_dir = %q
  log_level = "DEBUG"
  server_address = "127.0.0.1"
  server_port = "%d"
  socket_path = %q
  trust_bundle_path = %q
  trust_domain = %q
  join_token = %q
  sds {
    default_svid_name = %q
    default_bundle_name = %q
    default_all_bundles_name = %q
  }
  experimental {
    sync_interval = %q
  }
}

plugins {
  NodeAttestor "join_token" {
    plugin_data {}
  }
  KeyManager "memory" {
    plugin_data {}
  }
  WorkloadAttestor "unix" {
    plugin_data {}
  }
}
`, filepath.Join(dir, "data"), a.server.port, a.socket, bundlePath, a.server.trustDomain, token,
		cfg.DefaultSVIDName, cfg.DefaultBundleName, cfg.DefaultAllBundlesName, cfg.SyncInterval.String())
}

// healthy runs spire-agent's own health check on the Workload API socket.
func (a *Agent) healthy() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, a.bin, "healthcheck", "-socketPath", a.socket).CombinedOutput()
	if err != nil {
		return fmt.Errorf("spire-agent healthcheck: %w: %s", err, out)
	}
	return nil
}

// ID is the agent's SPIFFE ID, the parent of the entries it serves.
func (a *Agent) ID() string { return a.id }

// SocketPath is the Workload API socket, where the agent serves SDS too.
func (a *Agent) SocketPath() string { return a.socket }

// Logs is what the agent logged so far.
func (a *Agent) Logs() string { return a.logs.String() }

// RegisterUID registers spiffeID for processes of uid under this agent,
// federating with federatesWith (trust domain names), and returns the
// entry. Pass os.Getuid() for the test process itself.
func (a *Agent) RegisterUID(t testing.TB, spiffeID string, uid int, federatesWith ...string) Entry {
	t.Helper()
	e := Entry{ParentID: a.id, SPIFFEID: spiffeID, Selectors: []string{UIDSelector(uid)}, FederatesWith: federatesWith}
	a.server.CreateEntry(t, e)
	return e
}
