package main

import (
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
)

// stateReaders are the commands that read state and print it: each takes
// -o table|wide|name|json|yaml|jsonpath= and --no-headers (AddOutputFlag). TestCommandTree fails for a command
// listed here without the flag and for a command with -o missing here; a
// new state-reading command must be added by hand (a test cannot tell it
// reads state).
var stateReaders = []string{
	"trustbridge version",
	"trustbridge audit",
	"trustbridge audit log verify",
	"trustbridge bundle inspect",
	"trustbridge federation status",
	"trustbridge federation list",
	"trustbridge federation show",
	"trustbridge bundle list",
	"trustbridge ca authority list",
	"trustbridge ca drill", // changes state, and prints its timeline
	"trustbridge bundle show",
	"trustbridge policy explain",
	"trustbridge identity explain",
	"trustbridge jwt mint",
	"trustbridge jwt validate",
	"trustbridge x509 mint",
	"trustbridge agent api fetch x509",
	"trustbridge agent api fetch jwt",
	"trustbridge agent api fetch bundles",
	"trustbridge agent api validate jwt",
	"trustbridge token list",
}

// Every command, groups included, shows an example of its use, and every
// state reader takes -o.
func TestCommandTree(t *testing.T) {
	root := newRootCmd(cli.Env{In: strings.NewReader(""), Out: io.Discard, Err: io.Discard, Now: time.Now})
	seen := map[string]*cobra.Command{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Name() == "help" || c.Name() == "completion" {
			return
		}
		seen[c.CommandPath()] = c
		assert.NotEmpty(t, strings.TrimSpace(c.Example), "%s has no Example", c.CommandPath())
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	for path, c := range seen {
		if c.Flags().Lookup("output") != nil {
			assert.Contains(t, stateReaders, path, "%s takes -o: list it in stateReaders", path)
		}
	}
	for _, path := range stateReaders {
		c, ok := seen[path]
		if !assert.True(t, ok, "%s: no such command", path) {
			continue
		}
		o := c.Flags().Lookup("output")
		if assert.NotNil(t, o, "%s has no -o", path) {
			assert.Equal(t, "o", o.Shorthand, path)
			for _, f := range []string{cli.OutputTable, cli.OutputWide, cli.OutputName, cli.OutputJSON, cli.OutputYAML, "jsonpath=TEMPLATE"} {
				assert.Contains(t, o.Usage, f, "%s -o", path)
			}
			assert.NotNil(t, c.Flags().Lookup("no-headers"), "%s has no --no-headers", path)
		}
	}
}

// Every example line that starts with "trustbridge" parses: the command
// exists and every flag it names is one of that command's.
func TestExamplesParse(t *testing.T) {
	root := newRootCmd(cli.Env{In: strings.NewReader(""), Out: io.Discard, Err: io.Discard, Now: time.Now})
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, line := range exampleCommands(c.Example) {
			t.Run(line, func(t *testing.T) {
				args := shellWords(line)[1:]
				cmd, rest, err := root.Find(args)
				require.NoError(t, err)
				cmd.InitDefaultHelpFlag()
				cmd.InitDefaultVersionFlag()
				fs := cmd.Flags()
				require.NoError(t, fs.Parse(rest), "%s", cmd.CommandPath())
				for _, f := range []string{"json", "format", "out", "cert-dir", "output-certs"} {
					if fl := fs.Lookup(f); fl != nil && fl.Changed && fl.Hidden {
						t.Errorf("example uses the deprecated --%s", f)
					}
				}
			})
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
}

// Help that says a command needs the admin token also says the admin
// socket, found by default, does instead (it needs none), and none sends
// a static bundle's deletion to federation remove (bundle delete does it).
func TestHelpNamesAdminSocket(t *testing.T) {
	root := newRootCmd(cli.Env{In: strings.NewReader(""), Out: io.Discard, Err: io.Discard, Now: time.Now})
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		help := strings.Join(strings.Fields(c.Long+" "+c.Example), " ")
		for _, sentence := range strings.Split(help, ". ") {
			if strings.Contains(sentence, "eeds the admin token") && !strings.Contains(sentence, "either needs") && !strings.Contains(sentence, "admin socket") {
				t.Errorf("%s: %q says nothing of the admin socket", c.CommandPath(), sentence)
			}
		}
		assert.NotContains(t, help, "removed with federation remove", c.CommandPath())
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
}

// exampleCommands are the trustbridge invocations of an Example, with
// continuation lines joined, comments, pipes and redirections cut.
func exampleCommands(example string) []string {
	var out []string
	var cur string
	for _, l := range strings.Split(example, "\n") {
		l = strings.TrimSpace(l)
		if cur != "" {
			cur += " " + l
		} else {
			cur = l
		}
		if strings.HasSuffix(cur, "\\") {
			cur = strings.TrimSuffix(cur, "\\")
			continue
		}
		for _, part := range strings.Split(cur, "|") {
			part = strings.TrimSpace(part)
			if i := strings.Index(part, " #"); i >= 0 {
				part = part[:i]
			}
			for _, r := range []string{" >", " <"} {
				if i := strings.Index(part, r); i >= 0 {
					part = part[:i]
				}
			}
			// Environment assignments before the command (the agent's
			// istio-agent variables) are the shell's, not arguments.
			part = strings.TrimSpace(envAssignments.ReplaceAllString(part, ""))
			if strings.HasPrefix(part, "trustbridge ") || part == "trustbridge" {
				out = append(out, part)
			}
		}
		cur = ""
	}
	return out
}

// envAssignments are leading NAME=value words of a command line.
var envAssignments = regexp.MustCompile(`^([A-Z_][A-Z0-9_]*=\S*\s+)+`)

// shellWords splits on spaces, keeping '...' and "..." together (enough
// for the examples, which have no escapes inside quotes).
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	var quote rune
	in := false
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(r)
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == ' ':
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, w.String())
	}
	return words
}
