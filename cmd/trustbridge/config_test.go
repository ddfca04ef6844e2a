package main

import (
	"bytes"
	"fmt"
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

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/flagenv"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func serverFlagSet() (*pflag.FlagSet, *server.Config) {
	var o server.Config
	fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.AddFlags(fs)
	return fs, &o
}

// The file's federation list is read as --federation-config reads its
// file, with the config file's line numbers in errors.
func TestConfigInlineFederation(t *testing.T) {
	path := servertest.WriteConfig(t, `trust-domain: east.example
federation:
  - trustDomain: west.example
    bundleEndpointURL: https://west.example/
    bundleEndpointProfile:
      type: https_web
log-level: debug
`)
	fs, o := serverFlagSet()
	require.NoError(t, fs.Parse([]string{"--config", path}))
	require.NoError(t, o.Load(fs, servertest.NoEnv))
	assert.Equal(t, "debug", o.LogLevel)
	_, fromFile, _, err := server.StaticEndpoints(o.Federation, spiffeid.RequireTrustDomainFromString("east.example"), nil)
	require.NoError(t, err)
	require.Len(t, fromFile, 1)
	assert.Equal(t, "west.example|https://west.example/", fromFile[0].String())

	bad := servertest.WriteConfig(t, `trust-domain: east.example
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

	both := servertest.WriteConfig(t, "trust-domain: east.example\nfederation-config: x.yaml\nfederation: []\n")
	_, stderr, code := runCLI(t, "", "config", "check", both)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "do not combine")
}

func TestConfigCheck(t *testing.T) {
	t.Setenv("TRUST_DOMAIN", "")
	good := servertest.WriteConfig(t, "trust-domain: east.example\ngrpc-listen: 127.0.0.1:15012\n")
	out, stderr, code := runCLI(t, "", "config", "check", good)
	assert.Equal(t, 0, code, stderr)
	assert.Equal(t, good+": ok\n", out)

	bad := servertest.WriteConfig(t, `ca-key-type: dsa
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
	crd := servertest.WriteConfig(t, "trust-domain: east.example\nfederation-crd: true\n")
	out, _, code = runCLI(t, "", "config", "check", crd)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "--federation-crd needs --storage kube")

	_, stderr, code = runCLI(t, "", "config", "check", filepath.Join(t.TempDir(), "missing.yaml"))
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "missing.yaml")
}

// docs/configuration.md lists every flag of every command; `go test
// ./cmd/trustbridge -run TestConfigurationDoc -update` rewrites it.
func TestConfigurationDoc(t *testing.T) {
	root := newRootCmd(cli.Env{In: strings.NewReader(""), Out: io.Discard, Err: io.Discard, Now: time.Now})
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
	example := servertest.WriteConfig(t, string(m[1]))
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
