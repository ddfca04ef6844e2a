package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// A doc that quotes an alert condition (a PromQL expression ending in a
// comparison, in backquotes) over a metric some alert rule of
// deploy/monitoring/alerts.yaml watches quotes that rule's expression
// exactly, so a reader tuning it works on what Prometheus evaluates.
func TestDocsQuoteAlertRules(t *testing.T) {
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "monitoring", "alerts.yaml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(data, &rules))
	metricRe := regexp.MustCompile(`trustbridge_\w+`)
	exprs := map[string][]string{} // metric → expressions of the rules that use it
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			for _, m := range metricRe.FindAllString(r.Expr, -1) {
				exprs[m] = append(exprs[m], r.Expr)
			}
		}
	}
	quoteRe := regexp.MustCompile("`([^`\n]*trustbridge_\\w+[^`\n]*[<>]=? ?[0-9.]+)`")
	docs, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, docs)
	for _, doc := range docs {
		data, err := os.ReadFile(doc)
		require.NoError(t, err)
		for _, q := range quoteRe.FindAllStringSubmatch(string(data), -1) {
			for _, m := range metricRe.FindAllString(q[1], -1) {
				if want := exprs[m]; want != nil {
					assert.Contains(t, want, q[1], "%s quotes an alert condition on %s that no rule of alerts.yaml has", filepath.Base(doc), m)
				}
			}
		}
	}
}

// A paragraph (or list item, or table row) of the docs that tells which DNS
// zones a downstream's intermediate may vouch for, the zone of
// --workload-dns-name-template, names --downstream-dns-domain too: the two
// flags together decide it, and a doc naming one alone tells an operator
// that names outside the template's zone cannot be had.
func TestDocsDownstreamDNSZones(t *testing.T) {
	docs, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	require.NoError(t, err)
	docs = append(docs, filepath.Join("..", "..", "README.md"), filepath.Join("..", "..", "SECURITY.md"))
	paraRe := regexp.MustCompile(`\n\s*\n|\n(?:\s*- |\| )`)
	for _, doc := range docs {
		data, err := os.ReadFile(doc)
		require.NoError(t, err)
		for _, p := range paraRe.Split(string(data), -1) {
			if strings.Contains(p, "intermediate") && strings.Contains(p, "zone") &&
				(strings.Contains(p, "template") || strings.Contains(p, "WorkloadDNSZone")) {
				assert.Contains(t, p, "--downstream-dns-domain", "%s: a downstream intermediate's DNS zones without --downstream-dns-domain", filepath.Base(doc))
			}
		}
	}
}

// Every trustbridge command line in the shell blocks of
// docs/node-agent.md names a command and flags that exist and parse: an
// operator copies them.
func TestDocsNodeAgentCommands(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "node-agent.md"))
	require.NoError(t, err)
	blockRe := regexp.MustCompile("(?s)```sh\n(.*?)```")
	var lines []string
	for _, b := range blockRe.FindAllStringSubmatch(string(data), -1) {
		for _, l := range strings.Split(strings.ReplaceAll(b[1], "\\\n", " "), "\n") {
			if l = strings.TrimSpace(l); strings.HasPrefix(l, "trustbridge ") {
				lines = append(lines, l)
			}
		}
	}
	require.NotEmpty(t, lines, "the guide shows how to run the agent and the server")
	for _, l := range lines {
		args := strings.Fields(strings.ReplaceAll(l, "'", ""))[1:]
		e, _, _ := testEnv(t, "text")
		root := newRootCmd(e)
		cmd, rest, err := root.Find(args)
		require.NoError(t, err, "%s", l)
		require.NotEqual(t, root.Name(), cmd.Name(), "%s: no such command", l)
		assert.NoError(t, cmd.ParseFlags(rest), "%s", l)
	}
}
