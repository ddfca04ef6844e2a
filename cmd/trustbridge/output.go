package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// outputFlag is the -o/--output flag every command that reads state
// takes: table for people, json and yaml for scripts, and a command's own
// extra formats (bundle inspect's pem and spiffe). yaml is the json
// document converted, so both carry the same keys.
type outputFlag struct {
	format  string
	allowed []string
}

// Output formats every state-reading command has.
const (
	outputTable = "table"
	outputJSON  = "json"
	outputYAML  = "yaml"
)

// addOutputFlag registers -o/--output on cmd, defaulting to table, with
// extra formats after the common three. --json, the flag these commands
// had before -o, stays for a release as a hidden alias that warns.
func addOutputFlag(cmd *cobra.Command, extra ...string) *outputFlag {
	o := &outputFlag{format: outputTable, allowed: append([]string{outputTable, outputJSON, outputYAML}, extra...)}
	f := cmd.Flags()
	f.StringVarP(&o.format, "output", "o", outputTable, "output format: "+strings.Join(o.allowed, "|"))
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
	o   *outputFlag
	cmd *cobra.Command
}

func (j jsonAlias) String() string { return "false" }
func (j jsonAlias) Type() string   { return "bool" }
func (j jsonAlias) Set(s string) error {
	switch s {
	case "true":
		j.o.format = outputJSON
		fmt.Fprintln(j.cmd.ErrOrStderr(), "trustbridge: --json is deprecated and goes in a later release; use -o json")
	case "false":
	default:
		return fmt.Errorf("want true or false, not %q", s)
	}
	return nil
}

// check refuses a format the command does not have, naming those it has.
func (o *outputFlag) check() error {
	if !slices.Contains(o.allowed, o.format) {
		return fmt.Errorf("-o %q: want %s", o.format, strings.Join(o.allowed, ", "))
	}
	return nil
}

// is reports whether the chosen format is f, for a command's own formats.
func (o *outputFlag) is(f string) bool { return o.format == f }

// write prints v as the chosen format: table calls table, json and yaml
// encode v (indented JSON; YAML with the JSON keys). Other formats are
// the command's to handle before calling write.
func (o *outputFlag) write(w io.Writer, v any, table func(io.Writer) error) error {
	if err := o.check(); err != nil {
		return err
	}
	switch o.format {
	case outputTable:
		return table(w)
	case outputJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case outputYAML:
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
		return fmt.Errorf("-o %s: not handled by this command", o.format)
	}
}
