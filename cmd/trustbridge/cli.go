package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/trustbridge/trustbridge/internal/server/flagenv"
)

// suggestDistance is how far (in edits) a mistyped command or flag name may
// be from a real one to be suggested; cobra's default for commands.
const suggestDistance = 2

// setupCLI gives the finished command tree what every command shares:
// --version, did-you-mean for commands and flags, and groups (ca, audit
// log, ...) that name an unknown subcommand instead of printing help.
// It runs after every command is added, so commands added later by any
// file get the same.
func setupCLI(root *cobra.Command) {
	root.Version = versionString()
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(flagError)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.SuggestionsMinimumDistance = suggestDistance
		if c.HasSubCommands() && c.Run == nil && c.RunE == nil {
			c.Args = cobra.ArbitraryArgs
			c.RunE = groupRun
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
}

// groupRun is the RunE of a command that only groups others: cobra runs
// nothing for it and prints help, so `trustbridge ca isue` would not say
// what was wrong. It names the unknown subcommand and suggests a close
// one, as cobra does on the root.
func groupRun(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return cmd.Help()
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
	}
	return fmt.Errorf("%s\n\nRun '%s --help' for usage", msg, cmd.CommandPath())
}

// flagError adds a did-you-mean to pflag's "unknown flag: --x", which
// cobra does not do for flags.
func flagError(cmd *cobra.Command, err error) error {
	const prefix = "unknown flag: --"
	msg := err.Error()
	if !strings.HasPrefix(msg, prefix) {
		return err
	}
	var names []string
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if !f.Hidden && f.Deprecated == "" {
			names = append(names, f.Name)
		}
	})
	typed, _, _ := strings.Cut(strings.TrimPrefix(msg, prefix), "=")
	if s := suggestFlags(typed, names); len(s) > 0 {
		return fmt.Errorf("%w\ndid you mean --%s?", err, strings.Join(s, " or --"))
	}
	return errors.Join(err, fmt.Errorf("run '%s --help' for its flags", cmd.CommandPath()))
}

// suggestFlags returns the names within suggestDistance edits of typed
// (case-insensitive), or that typed is a prefix of, closest first.
func suggestFlags(typed string, names []string) []string {
	type cand struct {
		name string
		d    int
	}
	var cs []cand
	lt := strings.ToLower(typed)
	for _, n := range names {
		d := flagenv.Levenshtein(lt, strings.ToLower(n))
		if d <= suggestDistance || (len(typed) >= 3 && strings.HasPrefix(n, lt)) {
			cs = append(cs, cand{n, d})
		}
	}
	slices.SortStableFunc(cs, func(a, b cand) int {
		if a.d != b.d {
			return a.d - b.d
		}
		return strings.Compare(a.name, b.name)
	})
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, c.name)
	}
	return out
}
