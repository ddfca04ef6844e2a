package main

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/trustbridge/trustbridge/internal/flagenv"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func serverFlagSet() (*pflag.FlagSet, *Config) {
	var o Config
	fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addServerFlags(fs, &o)
	return fs, &o
}

func noEnv(string) string { return "" }

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
`), noEnv)
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
			_, err := applyConfig(fs, []byte(tc.yaml), noEnv)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Equal(t, before.DataDir, o.DataDir, "a bad file changes nothing")
		})
	}
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trustbridge.yaml")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
	return path
}

// The file's federation list is read as --federation-config reads its
// file, with the config file's line numbers in errors.
func TestConfigInlineFederation(t *testing.T) {
	path := writeConfig(t, `trust-domain: east.example
federation:
  - trustDomain: west.example
    bundleEndpointURL: https://west.example/
    bundleEndpointProfile:
      type: https_web
log-level: debug
`)
	fs, o := serverFlagSet()
	require.NoError(t, fs.Parse([]string{"--config", path}))
	require.NoError(t, loadServerConfig(fs, o, noEnv))
	assert.Equal(t, "debug", o.LogLevel)
	_, fromFile, _, err := StaticEndpoints(o.Federation, spiffeid.RequireTrustDomainFromString("east.example"), nil)
	require.NoError(t, err)
	require.Len(t, fromFile, 1)
	assert.Equal(t, "west.example|https://west.example/", fromFile[0].String())

	bad := writeConfig(t, `trust-domain: east.example
log-level: debug

federation:
  - trustDomain: west.example
    bundleEndpointURL: http://west.example/
    bundleEndpointProfile: {type: https_web}
`)
	out, _, code := runCLI(t, "", "config", "check", bad)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "line 6")
	assert.Contains(t, out, "scheme must be https")

	both := writeConfig(t, "trust-domain: east.example\nfederation-config: x.yaml\nfederation: []\n")
	_, stderr, code := runCLI(t, "", "config", "check", both)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "do not combine")
}

func TestConfigCheck(t *testing.T) {
	t.Setenv("TRUST_DOMAIN", "")
	good := writeConfig(t, "trust-domain: east.example\ngrpc-listen: 127.0.0.1:15012\n")
	out, stderr, code := runCLI(t, "", "config", "check", good)
	assert.Equal(t, 0, code, stderr)
	assert.Equal(t, good+": ok\n", out)

	bad := writeConfig(t, `ca-key-type: dsa
storage: kube
ca-dir: /etc/cacerts
admin-listen: localhost
log-format: xml
bundle-profile: https_web
bundle-endpoint-spiffe-id: spiffe://x/y
federation-crd: true
`)
	out, _, code = runCLI(t, "", "config", "check", bad)
	assert.Equal(t, 1, code)
	for _, want := range []string{"trust-domain (or TRUST_DOMAIN) is required", "ca-key-type", "--ca-dir and --storage kube",
		`admin-listen "localhost"`, `--log-format "xml"`, "bundle-endpoint-spiffe-id needs bundle-profile https_spiffe"} {
		assert.Contains(t, out, want)
	}
	crd := writeConfig(t, "trust-domain: east.example\nfederation-crd: true\n")
	out, _, code = runCLI(t, "", "config", "check", crd)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "--federation-crd needs --storage kube")

	_, stderr, code = runCLI(t, "", "config", "check", filepath.Join(t.TempDir(), "missing.yaml"))
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "missing.yaml")
}

// The server starts from a config file alone.
func TestServerFromConfigFile(t *testing.T) {
	path := writeConfig(t, fmt.Sprintf("trust-domain: conf.example\ndata-dir: %s\nadmin-listen: 127.0.0.1:0\nbundle-listen: \"\"\nlog-format: json\n", t.TempDir()))
	fs, o := serverFlagSet()
	require.NoError(t, fs.Parse([]string{"--config", path}))
	require.NoError(t, loadServerConfig(fs, o, noEnv))
	admin, banner, _ := launchServer(t, *o)
	assert.Equal(t, "conf.example", logAttr(t, banner, "trustbridge server started", "trust_domain"))
	assert.Equal(t, "conf.example", trustOf(t, admin).TrustDomain)
}

func FuzzConfig(f *testing.F) {
	f.Add([]byte("trust-domain: a.example\nworkload-ttl: 1h\ngrpc-dns-names: [a]\n"))
	f.Add([]byte("federation:\n  - trustDomain: b.example\n"))
	f.Add([]byte("&a x: *a\n"))
	f.Add([]byte("---\n---\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fs, _ := serverFlagSet()
		cf, err := applyConfig(fs, data, noEnv)
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

// docs/configuration.md lists every flag of every command; `go test
// ./cmd/trustbridge -run TestConfigurationDoc -update` rewrites it.
func TestConfigurationDoc(t *testing.T) {
	root := newRootCmd(env{in: strings.NewReader(""), out: io.Discard, err: io.Discard, now: time.Now})
	var b strings.Builder
	var missing []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		var rows []string
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Name == "help" || f.Hidden { // hidden: deprecated names
				return
			}
			if strings.TrimSpace(f.Usage) == "" {
				missing = append(missing, c.CommandPath()+" --"+f.Name)
			}
			def := f.DefValue
			if def == "" || def == "[]" {
				def = "—"
			} else {
				def = "`" + def + "`"
			}
			envName := "—"
			if e := flagenv.Vars(f); len(e) > 0 {
				envName = "`" + strings.Join(e, "`, `") + "`"
			}
			rows = append(rows, fmt.Sprintf("| `--%s` | %s | %s | %s | %s |", f.Name, f.Value.Type(), def, envName,
				strings.ReplaceAll(strings.ReplaceAll(f.Usage, "|", "\\|"), "\n", " ")))
		})
		if len(rows) > 0 {
			fmt.Fprintf(&b, "\n### `%s`\n\n%s\n\n| Flag | Type | Default | Env | Description |\n|---|---|---|---|---|\n%s\n",
				c.CommandPath(), c.Short, strings.Join(rows, "\n"))
		}
		subs := c.Commands()
		sort.Slice(subs, func(i, j int) bool { return subs[i].Name() < subs[j].Name() })
		for _, s := range subs {
			if s.Name() != "help" && s.Name() != "completion" {
				walk(s)
			}
		}
	}
	walk(root)
	assert.Empty(t, missing, "flags without usage text")

	path := filepath.Join("..", "..", "docs", "configuration.md")
	current, err := os.ReadFile(path)
	if *update {
		require.NoError(t, err, "the hand-written part of docs/configuration.md must exist")
		const marker = "<!-- flags: generated by `go test ./cmd/trustbridge -run TestConfigurationDoc -update` -->\n"
		i := bytes.Index(current, []byte(marker))
		require.GreaterOrEqual(t, i, 0, "marker missing")
		out := append(append([]byte{}, current[:i+len(marker)]...), []byte(b.String())...)
		require.NoError(t, os.WriteFile(path, out, 0o644))
		current = out
	}
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(string(current), b.String()),
		"docs/configuration.md is out of date: go test ./cmd/trustbridge -run TestConfigurationDoc -update")

	// The example file in the document is valid.
	m := regexp.MustCompile("(?s)<!-- example -->\n```yaml\n(.*?)```").FindSubmatch(current)
	require.NotNil(t, m, "example config missing")
	example := writeConfig(t, string(m[1]))
	// The example's bootstrap bundle, as west's operator would hand it over.
	west, err := bundledoc.Marshal(testca.New(t, "west.example").Bundle())
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(filepath.Dir(example), "west.example.json"), west, 0o600))
	t.Setenv("TRUST_DOMAIN", "")
	t.Setenv("POD_NAMESPACE", "")
	out, stderr, code := runCLI(t, "", "config", "check", example)
	assert.Equal(t, 0, code, out+stderr)
}

// The config files the Kubernetes manifests ship are valid.
func TestDeployConfigsCheck(t *testing.T) {
	t.Setenv("TRUST_DOMAIN", "")
	for _, path := range []string{"base/config.yaml", "examples/two-clusters/east/config.yaml", "examples/two-clusters/west/config.yaml",
		"examples/upstream-kube-csr/config.yaml"} {
		out, stderr, code := runCLI(t, "", "config", "check", filepath.Join("..", "..", "deploy", path))
		assert.Equal(t, 0, code, "%s: %s%s", path, out, stderr)
	}
}
