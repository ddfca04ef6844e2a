package main

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/flagenv"
)

func TestLevenshtein(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"", "abc", 3},
		{"abc", "", 3},
		{"trust-domain", "trust-domain", 0},
		{"trust-domian", "trust-domain", 2},
		{"trust-doman", "trust-domain", 1},
		{"kitten", "sitting", 3},
	} {
		t.Run(tc.a+"/"+tc.b, func(t *testing.T) {
			assert.Equal(t, tc.want, flagenv.Levenshtein(tc.a, tc.b))
			assert.Equal(t, tc.want, flagenv.Levenshtein(tc.b, tc.a), "symmetric")
		})
	}
}

func TestSuggestFlags(t *testing.T) {
	names := []string{"trust-domain", "data-dir", "ca-dir", "ca-ttl", "ca-key-type", "log-level", "log-format"}
	for _, tc := range []struct {
		typed string
		want  []string
	}{
		{"trust-domian", []string{"trust-domain"}},
		{"TRUST-DOMAIN", []string{"trust-domain"}},
		{"data-dri", []string{"data-dir"}},
		{"ca-di", []string{"ca-dir"}},
		{"log", []string{"log-level", "log-format"}},
		{"zzzzzz", []string{}},
	} {
		t.Run(tc.typed, func(t *testing.T) {
			assert.Equal(t, tc.want, suggestFlags(tc.typed, names))
		})
	}
}

func TestCLISuggestions(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"mistyped flag", []string{"server", "--trust-domian", "x"}, []string{"unknown flag: --trust-domian", "did you mean --trust-domain?"}},
		{"mistyped flag with =", []string{"server", "--trust-domian=x"}, []string{"did you mean --trust-domain?"}},
		{"far from every flag", []string{"server", "--zzzzzzzz"}, []string{"unknown flag: --zzzzzzzz", "trustbridge server --help"}},
		{"mistyped command", []string{"sever"}, []string{`unknown command "sever"`, "server"}},
		{"mistyped subcommand", []string{"ca", "isue"}, []string{`unknown command "isue" for "trustbridge ca"`, "issue"}},
		{"mistyped nested subcommand", []string{"audit", "log", "verfy"}, []string{`unknown command "verfy" for "trustbridge audit log"`, "verify"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := runCLI(t, "", tc.args...)
			assert.Equal(t, 1, code)
			for _, w := range tc.want {
				assert.Contains(t, stderr, w)
			}
		})
	}
}

func TestVersionFlag(t *testing.T) {
	flag, stderr, code := runCLI(t, "", "--version")
	assert.Equal(t, 0, code, stderr)
	cmd, _, _ := runCLI(t, "", "version")
	assert.Equal(t, cmd, flag, "--version prints what trustbridge version prints")
	assert.True(t, strings.HasPrefix(flag, "trustbridge "), flag)
}

func TestVersionOutput(t *testing.T) {
	out, stderr, code := runCLI(t, "", "version", "-o", "json")
	require.Equal(t, 0, code, stderr)
	var v map[string]string
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	assert.Equal(t, runtime.Version(), v["go_version"])
	assert.Equal(t, runtime.GOOS, v["os"])
	assert.Equal(t, runtime.GOARCH, v["arch"])
	assert.NotEmpty(t, v["version"])
	out, _, code = runCLI(t, "", "version", "-o", "yaml")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "go_version: "+runtime.Version())
}
