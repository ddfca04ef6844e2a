package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// OutputFlag is the -o/--output flag every command that reads state
// takes: table for people, json and yaml for scripts, and a command's own
// extra formats (bundle inspect's pem and spiffe). yaml is the json
// document converted, so both carry the same keys.
type OutputFlag struct {
	Format  string
	allowed []string
}

// Output formats every state-reading command has.
const (
	OutputTable = "table"
	OutputJSON  = "json"
	OutputYAML  = "yaml"
)

// AddOutputFlag registers -o/--output on cmd, defaulting to table, with
// extra formats after the common three. --json, the flag these commands
// had before -o, stays for a release as a hidden alias that warns.
func AddOutputFlag(cmd *cobra.Command, extra ...string) *OutputFlag {
	o := &OutputFlag{Format: OutputTable, allowed: append([]string{OutputTable, OutputJSON, OutputYAML}, extra...)}
	f := cmd.Flags()
	f.StringVarP(&o.Format, "output", "o", OutputTable, "output format: "+strings.Join(o.allowed, "|"))
	f.Var(jsonAlias{o, cmd}, "json", "same as -o json")
	f.Lookup("json").NoOptDefVal = "true"
	_ = f.MarkHidden("json")
	return o
}

// jsonAlias is the deprecated --json: setting it selects -o json and
// warns on the command's stderr. (pflag's MarkDeprecated would print its
// warning where cobra prints usage, stdout here, into the JSON a script
// reads.)
type jsonAlias struct {
	o   *OutputFlag
	cmd *cobra.Command
}

func (j jsonAlias) String() string { return "false" }
func (j jsonAlias) Type() string   { return "bool" }
func (j jsonAlias) Set(s string) error {
	switch s {
	case "true":
		j.o.Format = OutputJSON
		fmt.Fprintln(j.cmd.ErrOrStderr(), "trustbridge: --json is deprecated and goes in a later release; use -o json")
	case "false":
	default:
		return fmt.Errorf("want true or false, not %q", s)
	}
	return nil
}

// Check refuses a format the command does not have, naming those it has.
func (o *OutputFlag) Check() error {
	if !slices.Contains(o.allowed, o.Format) {
		return fmt.Errorf("-o %q: want %s", o.Format, strings.Join(o.allowed, ", "))
	}
	return nil
}

// Is reports whether the chosen format is f, for a command's own formats.
func (o *OutputFlag) Is(f string) bool { return o.Format == f }

// Write prints v as the chosen format: table calls table, json and yaml
// encode v (indented JSON; YAML with the JSON keys). Other formats are
// the command's to handle before calling write.
func (o *OutputFlag) Write(w io.Writer, v any, table func(io.Writer) error) error {
	if err := o.Check(); err != nil {
		return err
	}
	switch o.Format {
	case OutputTable:
		return table(w)
	case OutputJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case OutputYAML:
		js, err := json.Marshal(v)
		if err != nil {
			return err
		}
		y, err := yaml.JSONToYAML(js)
		if err != nil {
			return err
		}
		_, err = w.Write(y)
		return err
	default:
		return fmt.Errorf("-o %s: not handled by this command", o.Format)
	}
}

// Printable escapes control and other non-printable characters. Subjects
// and kids come from untrusted documents; printed raw, an escape sequence
// could clear the screen or forge table rows in an auditor's terminal.
func Printable(s string) string {
	clean := true
	for _, r := range s {
		if !unicode.IsPrint(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}
