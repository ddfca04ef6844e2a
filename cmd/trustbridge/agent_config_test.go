package main

import (
	"bytes"
	"crypto/x509"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/agent"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/sds"
	sdsagent "github.com/trustbridge/trustbridge/sds/agent"
)

// parseAgent parses args and env as trustbridge agent does, up to the
// configuration it would run with.
func parseAgent(t *testing.T, args []string, env map[string]string) (agent.Config, sdsagent.Config, string, error) {
	t.Helper()
	var o agent.Config
	var stderr bytes.Buffer
	cmd := &cobra.Command{Use: "agent"}
	cmd.SetErr(&stderr)
	old := cli.AddOldName(cmd, "output-certs", cli.CredentialsDirFlag)
	addAgentFlags(cmd.Flags(), &o)
	require.NoError(t, cmd.ParseFlags(args))
	if err := fromFlags(&o, cmd.Flags(), old, func(k string) string { return env[k] }); err != nil {
		return o, sdsagent.Config{}, stderr.String(), err
	}
	cfg, err := o.AgentConfig(slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	return o, cfg, stderr.String(), err
}

// The istio-agent names set the agent's flags: flag > env > default.
func TestAgentEnvPrecedence(t *testing.T) {
	root := servertest.WriteFile(t, string(cli.CertsPEM([]*x509.Certificate{testca.New(t, "example.org").Cert})), 0o644)
	ca := map[string]string{"CA_ADDR": "127.0.0.1:1", "CA_ROOT_CA": root}
	with := func(m map[string]string) map[string]string {
		out := map[string]string{"CA_ADDR": ca["CA_ADDR"], "CA_ROOT_CA": ca["CA_ROOT_CA"]}
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		args  []string
		env   map[string]string
		check func(t *testing.T, o agent.Config, cfg sdsagent.Config)
	}{
		{"defaults", nil, nil, func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			assert.Equal(t, 0.5, o.GraceRatio)
			assert.Zero(t, o.TTL)
			assert.Equal(t, defaultCredentialsDir, cfg.CredentialsDir)
			assert.Nil(t, cfg.Rotator, "no CA")
		}},
		{"CA_ADDR and CA_ROOT_CA", nil, ca, func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			require.NotNil(t, cfg.Rotator)
			assert.Equal(t, "127.0.0.1:1", cfg.Rotator.CAAddr)
			assert.Len(t, cfg.Rotator.Roots, 1)
			assert.Empty(t, cfg.Rotator.OutputCertsDir, "nothing written unless a directory is given")
		}},
		{"--ca-addr beats CA_ADDR", []string{"--ca-addr", "127.0.0.1:2"}, ca, func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			assert.Equal(t, "127.0.0.1:2", cfg.Rotator.CAAddr)
		}},
		{"SECRET_GRACE_PERIOD_RATIO", nil, with(map[string]string{"SECRET_GRACE_PERIOD_RATIO": "0.8"}), func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			assert.Equal(t, 0.8, cfg.Rotator.GraceRatio)
		}},
		{"--secret-grace-period-ratio beats it", []string{"--secret-grace-period-ratio", "0.6"}, with(map[string]string{"SECRET_GRACE_PERIOD_RATIO": "0.8"}), func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			assert.Equal(t, 0.6, cfg.Rotator.GraceRatio)
		}},
		{"SECRET_TTL", nil, with(map[string]string{"SECRET_TTL": "12h"}), func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			assert.Equal(t, 12*time.Hour, cfg.Rotator.TTL)
		}},
		{"--ttl beats SECRET_TTL", []string{"--ttl", "1h"}, with(map[string]string{"SECRET_TTL": "12h"}), func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			assert.Equal(t, time.Hour, cfg.Rotator.TTL)
		}},
		{"OUTPUT_CERTS: the agent keeps its certificates there", nil, with(map[string]string{"OUTPUT_CERTS": "/out"}), func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			assert.Equal(t, "/out", cfg.CredentialsDir)
			assert.Equal(t, "/out", cfg.Rotator.OutputCertsDir)
			assert.True(t, cfg.AdoptCredentialsDir, "OUTPUT_CERTS always meant: write here")
		}},
		{"--credentials-dir beats OUTPUT_CERTS", []string{"--credentials-dir", "/flag"}, with(map[string]string{"OUTPUT_CERTS": "/out"}), func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			assert.Equal(t, "/flag", cfg.Rotator.OutputCertsDir)
			assert.False(t, cfg.AdoptCredentialsDir, "files there may be another tool's")
		}},
		{"--output-certs, the old name", []string{"--output-certs", "/old"}, ca, func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			assert.Equal(t, "/old", cfg.CredentialsDir)
			assert.Equal(t, "/old", cfg.Rotator.OutputCertsDir)
			assert.True(t, cfg.AdoptCredentialsDir, "--output-certs always meant: write here")
		}},
		{"--output-certs beats OUTPUT_CERTS", []string{"--output-certs", "/old"}, with(map[string]string{"OUTPUT_CERTS": "/out"}), func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			assert.Equal(t, "/old", cfg.CredentialsDir)
			assert.Equal(t, "/old", cfg.Rotator.OutputCertsDir)
			assert.Equal(t, "--output-certs /old", o.Source(cli.CredentialsDirFlag, o.CredentialsDir), "errors name the flag typed")
		}},
		{"--output-certs without a CA beats OUTPUT_CERTS", []string{"--output-certs", "/old"}, map[string]string{"OUTPUT_CERTS": "/out"}, func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			assert.Equal(t, "/old", cfg.CredentialsDir)
			assert.Nil(t, cfg.Rotator)
		}},
		{"--credentials-dir names itself", []string{"--credentials-dir", "/flag"}, with(map[string]string{"OUTPUT_CERTS": "/out"}), func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			assert.Equal(t, "--credentials-dir /flag", o.Source(cli.CredentialsDirFlag, o.CredentialsDir))
		}},
		{"PROV_CERT", nil, with(map[string]string{"PROV_CERT": "/prov"}), func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			assert.Equal(t, "/prov", cfg.Rotator.ProvCertDir)
		}},
		{"TRUST_DOMAIN names the server", nil, with(map[string]string{"TRUST_DOMAIN": "example.org"}), func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			assert.Equal(t, "spiffe://example.org"+server.GRPCServingPath, cfg.Rotator.ServerID.String())
		}},
		{"FILE_MOUNTED_CERTS: no CA even with CA_ADDR", nil, with(map[string]string{"FILE_MOUNTED_CERTS": "true"}), func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			assert.Nil(t, cfg.Rotator)
		}},
		{"--file-mounted-certs=false beats FILE_MOUNTED_CERTS", []string{"--file-mounted-certs=false"}, with(map[string]string{"FILE_MOUNTED_CERTS": "true"}), func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			assert.NotNil(t, cfg.Rotator)
		}},
		{"an empty variable is unset", nil, with(map[string]string{"SECRET_TTL": ""}), func(t *testing.T, o agent.Config, cfg sdsagent.Config) {
			assert.Zero(t, cfg.Rotator.TTL)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, cfg, stderr, err := parseAgent(t, tc.args, tc.env)
			require.NoError(t, err)
			tc.check(t, o, cfg)
			oldName := len(tc.args) > 0 && tc.args[0] == "--output-certs"
			assert.Equal(t, oldName, strings.Contains(stderr, "--output-certs is deprecated"), stderr)
		})
	}
}

// A value the agent cannot honour is an error naming its variable.
func TestAgentEnvErrors(t *testing.T) {
	root := servertest.WriteFile(t, string(cli.CertsPEM([]*x509.Certificate{testca.New(t, "example.org").Cert})), 0o644)
	ca := func(kv ...string) map[string]string {
		m := map[string]string{"CA_ADDR": "127.0.0.1:1", "CA_ROOT_CA": root}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"ratio not a number", nil, ca("SECRET_GRACE_PERIOD_RATIO", "half"), `SECRET_GRACE_PERIOD_RATIO="half" (for --secret-grace-period-ratio)`},
		{"ratio out of range", nil, ca("SECRET_GRACE_PERIOD_RATIO", "1.5"), "SECRET_GRACE_PERIOD_RATIO=1.5: want a number between 0 and 1"},
		{"ratio out of range, flag", []string{"--secret-grace-period-ratio", "1.5"}, ca(), "--secret-grace-period-ratio 1.5: want"},
		{"ttl not a duration", nil, ca("SECRET_TTL", "86400"), `SECRET_TTL="86400"`},
		{"ttl not whole seconds", nil, ca("SECRET_TTL", "1.5s"), "SECRET_TTL=1.5s: want a whole"},
		{"file mounted not a bool", nil, ca("FILE_MOUNTED_CERTS", "maybe"), `FILE_MOUNTED_CERTS="maybe"`},
		{"CA_ROOT_CA=SYSTEM", nil, ca("CA_ROOT_CA", "SYSTEM"), "CA_ROOT_CA=SYSTEM: the system's web roots cannot vouch"},
		{"CA_ROOT_CA missing file", nil, ca("CA_ROOT_CA", "/nonexistent/root.pem"), "CA_ROOT_CA=/nonexistent/root.pem"},
		{"OUTPUT_CERTS without a CA", nil, map[string]string{"OUTPUT_CERTS": "/out"}, "OUTPUT_CERTS=/out: OUTPUT_CERTS is where certificates from the CA are written, and no CA is used (no --ca-addr or CA_ADDR)"},
		{"OUTPUT_CERTS with FILE_MOUNTED_CERTS", nil, ca("OUTPUT_CERTS", "/out", "FILE_MOUNTED_CERTS", "true"), "no CA is used (FILE_MOUNTED_CERTS=true)"},
		{"PROV_CERT without a CA", nil, map[string]string{"PROV_CERT": "/prov"}, "PROV_CERT=/prov: a provisioning certificate authenticates to the CA"},
		{"TRUST_DOMAIN invalid", nil, ca("TRUST_DOMAIN", "Not A Domain"), `TRUST_DOMAIN=Not A Domain`},
		{"TRUST_DOMAIN and another server ID", []string{"--server-spiffe-id", "spiffe://other.org/x"}, ca("TRUST_DOMAIN", "example.org"), "is not in TRUST_DOMAIN=example.org"},
		{"old and new name, two directories", []string{"--output-certs", "/a", "--credentials-dir", "/b"}, ca(),
			"pass --credentials-dir /a (what --output-certs said), or --file-mounted-certs --credentials-dir /b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := parseAgent(t, tc.args, tc.env)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// The Workload API socket sits beside the SDS socket unless named; an
// empty --workload-api-socket turns it off.
func TestAgentWorkloadAPISocket(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"default", nil, defaultWorkloadSocket},
		{"beside --sds-socket", []string{"--sds-socket", "/run/tb/sds.sock"}, "/run/tb/" + workloadSocketName},
		{"named", []string{"--sds-socket", "/run/tb/sds.sock", "--workload-api-socket", "/run/api.sock"}, "/run/api.sock"},
		{"off", []string{"--workload-api-socket="}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, cfg, _, err := parseAgent(t, tc.args, nil)
			require.NoError(t, err)
			assert.Equal(t, tc.want, cfg.WorkloadAPISocket)
		})
	}
}

// --rootca picks what the socket's ROOTCA holds; an unknown value is an
// error naming the flag and the values it takes.
func TestAgentRootCA(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want sds.RootCAMode
		err  string
	}{
		{"default", nil, sds.RootCALocal, ""},
		{"local", []string{"--rootca", "local"}, sds.RootCALocal, ""},
		{"spiffe", []string{"--rootca", "spiffe"}, sds.RootCASPIFFE, ""},
		{"unknown", []string{"--rootca", "all"}, "", "--rootca all: want local or spiffe"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, cfg, _, err := parseAgent(t, tc.args, nil)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, cfg.RootCA)
		})
	}
}
