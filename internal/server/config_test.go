package server

import (
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

func serverFlagSet() (*pflag.FlagSet, *Config) {
	var o Config
	fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addServerFlags(fs, &o)
	return fs, &o
}

func TestConfigSetsFlags(t *testing.T) {
	fs, o := serverFlagSet()
	_, err := applyConfig(fs, []byte(`
# a comment
trust-domain: east.example
data-dir: /var/lib/trustbridge
workload-ttl: 12h
sds-workload-certs: false
grpc-dns-names: [a.example, b.example]
federation-allow-private: true
`), servertest.NoEnv)
	require.NoError(t, err)
	assert.Equal(t, "east.example", o.TrustDomain)
	assert.Equal(t, "/var/lib/trustbridge", o.DataDir)
	assert.Equal(t, 12*time.Hour, o.WorkloadTTL)
	assert.True(t, o.GRPC.noSDSCerts)
	assert.Equal(t, []string{"a.example", "b.example"}, o.GRPC.DNSNames)
	assert.True(t, o.Federation.AllowPrivate)
	assert.Equal(t, "127.0.0.1:15014", o.AdminListen, "unset keys keep their default")
}

// flag > env > file > default.
func TestConfigPrecedence(t *testing.T) {
	file := []byte("trust-domain: file.example\ndata-dir: /from/file\nnamespace: file-ns\n")
	env := map[string]string{"TRUST_DOMAIN": "env.example"}
	getenv := func(k string) string { return env[k] }

	fs, o := serverFlagSet()
	require.NoError(t, fs.Parse([]string{"--data-dir", "/from/flag"}))
	_, err := applyConfig(fs, file, getenv)
	require.NoError(t, err)
	assert.Equal(t, "/from/flag", o.DataDir, "flag beats file")
	assert.Empty(t, o.TrustDomain, "env beats file: the file's value is not applied")
	assert.Equal(t, "file-ns", o.Kube.Namespace, "file beats default")
	require.NoError(t, loadServerConfig(fs, o, getenv))
	assert.Equal(t, "env.example", o.TrustDomain)

	fs, o = serverFlagSet()
	require.NoError(t, fs.Parse([]string{"--trust-domain", "flag.example"}))
	_, err = applyConfig(fs, file, getenv)
	require.NoError(t, err)
	assert.Equal(t, "flag.example", o.TrustDomain, "flag beats env and file")
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown key", "trust-domain: a.example\ntrust-domian: b\n", `line 2: unknown key "trust-domian" (did you mean "trust-domain"?)`},
		{"underscores", "trust_domain: a.example\n", `line 1: unknown key "trust_domain" (did you mean "trust-domain"?)`},
		{"far off", "colour: blue\n", `line 1: unknown key "colour"; keys are the flags`},
		{"config is no key", "config: other.yaml\n", `line 1: unknown key "config"`},
		{"repeated", "data-dir: a\ndata-dir: b\n", `line 2: key "data-dir" repeated (first on line 1)`},
		{"bad duration", "ca-ttl: soon\n", `line 1: ca-ttl: `},
		{"bad bool", "federation-allow-private: maybe\n", `line 1: federation-allow-private: `},
		{"list for a value", "data-dir: [a, b]\n", `line 1: data-dir takes one value, not a list`},
		{"mapping for a value", "data-dir: {a: b}\n", `line 1: data-dir: want a value, got a mapping`},
		{"null", "data-dir:\n", `line 1: data-dir: no value`},
		{"anchor", "data-dir: &d /x\nca-dir: *d\n", `line 1: YAML anchors and aliases are not allowed`},
		{"two documents", "data-dir: a\n---\ndata-dir: b\n", `a second YAML document`},
		{"not a mapping", "- a\n- b\n", `want a mapping of flag names to values, got a list`},
		{"federation not a list", "federation: yes\n", `line 1: federation: want a list of endpoints`},
		{"bad yaml", "data-dir: [\n", `yaml: `},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, o := serverFlagSet()
			before := *o
			_, err := applyConfig(fs, []byte(tc.yaml), servertest.NoEnv)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Equal(t, before.DataDir, o.DataDir, "a bad file changes nothing")
		})
	}
}

// The server starts from a config file alone.
func TestServerFromConfigFile(t *testing.T) {
	path := servertest.WriteConfig(t, fmt.Sprintf("trust-domain: conf.example\ndata-dir: %s\nadmin-listen: 127.0.0.1:0\nbundle-listen: \"\"\nlog-format: json\n", t.TempDir()))
	fs, o := serverFlagSet()
	require.NoError(t, fs.Parse([]string{"--config", path}))
	require.NoError(t, loadServerConfig(fs, o, servertest.NoEnv))
	admin, banner, _ := launchServer(t, *o)
	assert.Equal(t, "conf.example", servertest.LogAttr(t, banner, "trustbridge server started", "trust_domain"))
	assert.Equal(t, "conf.example", servertest.TrustOf(t, admin).TrustDomain)
}

func FuzzConfig(f *testing.F) {
	f.Add([]byte("trust-domain: a.example\nworkload-ttl: 1h\ngrpc-dns-names: [a]\n"))
	f.Add([]byte("federation:\n  - trustDomain: b.example\n"))
	f.Add([]byte("&a x: *a\n"))
	f.Add([]byte("---\n---\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fs, _ := serverFlagSet()
		cf, err := applyConfig(fs, data, servertest.NoEnv)
		if err != nil {
			return
		}
		if cf.federation != nil {
			// Whatever the list holds, reading it fails cleanly or yields
			// endpoints: never a panic.
			_, _ = federation.ParseConfigList(cf.federation, func(string) ([]byte, error) { return nil, errors.New("no files") })
		}
	})
}
