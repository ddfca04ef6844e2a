package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/cli-runtime/pkg/printers"
	"k8s.io/client-go/util/jsonpath"
	"sigs.k8s.io/yaml"
)

// OutputFlag is the -o/--output flag every command that reads state
// takes, with kubectl's formats: table and wide for people, name for
// loops, json, yaml and jsonpath=TEMPLATE for scripts, and a command's
// own extra formats (bundle inspect's pem and spiffe). yaml is the json
// document converted, so both carry the same keys, and a jsonpath
// template reads that same document.
type OutputFlag struct {
	Format string
	// NoHeaders is --no-headers: table and wide print their rows only,
	// without the header line and without the lines around the table.
	NoHeaders bool
	allowed   []string
	path      *jsonpath.JSONPath
}

// Output formats every state-reading command has.
const (
	OutputTable    = "table"
	OutputWide     = "wide"
	OutputName     = "name"
	OutputJSON     = "json"
	OutputYAML     = "yaml"
	OutputJSONPath = "jsonpath"
)

// AddOutputFlag registers -o/--output and --no-headers on cmd, defaulting
// to table, with extra formats after the common ones. --json, the flag
// these commands had before -o, stays for a release as a hidden alias
// that warns.
func AddOutputFlag(cmd *cobra.Command, extra ...string) *OutputFlag {
	o := &OutputFlag{Format: OutputTable, allowed: append([]string{OutputTable, OutputWide, OutputName, OutputJSON, OutputYAML}, extra...)}
	f := cmd.Flags()
	f.StringVarP(&o.Format, "output", "o", OutputTable, "output format: "+strings.Join(o.allowed, "|")+"|jsonpath=TEMPLATE (kubectl's jsonpath, over the json document)")
	f.BoolVar(&o.NoHeaders, "no-headers", false, "table and wide: print the rows only, without the header line and the summary around them")
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

// Check refuses a format the command does not have, naming those it has,
// and a jsonpath template that does not parse: both before the command
// asks a server anything.
func (o *OutputFlag) Check() error {
	if tmpl, ok := strings.CutPrefix(o.Format, OutputJSONPath+"="); ok {
		return o.parsePath(tmpl)
	}
	if o.Format == OutputJSONPath {
		return fmt.Errorf(`-o jsonpath: give the template after "=", as in -o jsonpath='{.trust_domain}'`)
	}
	if !slices.Contains(o.allowed, o.Format) {
		return fmt.Errorf("-o %q: want %s or jsonpath=TEMPLATE", o.Format, strings.Join(o.allowed, ", "))
	}
	return nil
}

func (o *OutputFlag) parsePath(tmpl string) error {
	if o.path != nil {
		return nil
	}
	if strings.TrimSpace(tmpl) == "" {
		return errors.New(`-o jsonpath=: the template is empty; write one such as '{.trust_domain}' or '{range .[*]}{.trust_domain}{"\n"}{end}'`)
	}
	// client-go's parser reads ".[" as a field named "", which no
	// document has: "{.[*].trust_domain}", the root array as jq and
	// JSONPath write it, would select nothing. It means the root.
	tmpl = strings.ReplaceAll(strings.ReplaceAll(tmpl, "{.[", "{["), "{range .[", "{range [")
	p := jsonpath.New("output")
	// kubectl's default (--allow-missing-template-keys=true): a key that
	// one document lacks prints nothing rather than failing the command.
	p.AllowMissingKeys(true)
	if err := p.Parse(tmpl); err != nil {
		return fmt.Errorf("-o %s: %v; templates look like '{.trust_domain}' or '{range .[*]}{.trust_domain}{\"\\n\"}{end}' (kubectl's JSONPath)", o.Format, err)
	}
	o.path = p
	return nil
}

// Is reports whether the chosen format is f, for a command's own formats.
func (o *OutputFlag) Is(f string) bool { return o.Format == f }

// Human reports whether the output is for people (table or wide), where
// progress lines belong on stdout too.
func (o *OutputFlag) Human() bool { return o.Format == OutputTable || o.Format == OutputWide }

// Common reports whether the chosen format is one Print and Write
// handle, as opposed to a command's own extra format.
func (o *OutputFlag) Common() bool {
	switch o.Format {
	case OutputTable, OutputWide, OutputName, OutputJSON, OutputYAML:
		return true
	}
	return strings.HasPrefix(o.Format, OutputJSONPath+"=")
}

// Table is what a command shows for people, described once: the flag
// renders it as table (columns of priority 0), wide (every column), name
// (the rows' names, one a line) or, with --no-headers, the rows alone.
// Before and After are text written as given (ending in a newline)
// above and below the rows in table and wide; Empty is a line printed
// instead of a table without rows.
type Table struct {
	Columns []Column
	Rows    []Row
	Before  string
	After   string
	Empty   string
}

// Column is one column of a Table. A column of Priority above 0 shows
// only with -o wide, as kubectl's column priorities do.
type Column struct {
	Name     string
	Priority int32
}

// Row is one line of a Table: its cells, one per column, and the name
// -o name prints for it (a continuation line has none).
type Row struct {
	Name  string
	Cells []any
}

// Print writes v in the chosen format: t for table, wide and name; v
// itself for json, yaml and jsonpath.
func (o *OutputFlag) Print(w io.Writer, v any, t Table) error {
	if err := o.Check(); err != nil {
		return err
	}
	switch o.Format {
	case OutputTable, OutputWide:
		return o.printTable(w, t)
	case OutputName:
		return printNames(w, t)
	}
	return o.writeDocument(w, v)
}

// Write prints v in the chosen format with a table written by hand:
// table and wide call table (such a table has no wide columns); name and
// --no-headers need a Table's rows, so they refuse here. Commands move to
// Print to have them.
func (o *OutputFlag) Write(w io.Writer, v any, table func(io.Writer) error) error {
	if err := o.Check(); err != nil {
		return err
	}
	switch o.Format {
	case OutputTable, OutputWide:
		if o.NoHeaders {
			return errors.New("--no-headers: this command's table has no header line to leave out; use -o json or -o jsonpath=TEMPLATE for scripts")
		}
		return table(w)
	case OutputName:
		return errors.New("-o name: this command prints no list of named things; use -o jsonpath=TEMPLATE to pick fields")
	}
	return o.writeDocument(w, v)
}

// writeDocument prints v as json, yaml or through the jsonpath template.
func (o *OutputFlag) writeDocument(w io.Writer, v any) error {
	switch o.Format {
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
	}
	if o.path == nil {
		return fmt.Errorf("-o %s: not handled by this command", o.Format)
	}
	js, err := json.Marshal(v)
	if err != nil {
		return err
	}
	// apimachinery's decoder keeps whole numbers int64, as kubectl's
	// objects are: a 10-digit sequence prints as digits, not 1.2e+09.
	var doc any
	if err := utiljson.Unmarshal(js, &doc); err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := o.path.Execute(&buf, terminalSafe(doc)); err != nil {
		return fmt.Errorf("-o %s: %w", o.Format, err)
	}
	_, err = w.Write(buf.Bytes())
	return err
}

// terminalSafe is doc, decoded JSON, with its strings (keys too) made
// safe to print raw, as jsonpath output is: control characters other than
// tab and newline (C0, DEL, C1; ESC, which starts a terminal's escape
// sequences, among them) are written escaped, as \x1b. The tables escape
// theirs; a peer's certificate subject must not clear an operator's
// screen or forge lines here either.
func terminalSafe(doc any) any {
	switch v := doc.(type) {
	case string:
		return escapeControls(v)
	case []any:
		for i := range v {
			v[i] = terminalSafe(v[i])
		}
		return v
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[escapeControls(k)] = terminalSafe(e)
		}
		return out
	}
	return doc
}

// escapeControls writes s's control characters but tab and newline as Go
// escapes.
func escapeControls(s string) string {
	if !strings.ContainsFunc(s, isUnsafeControl) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if isUnsafeControl(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func isUnsafeControl(r rune) bool { return unicode.IsControl(r) && r != '\t' && r != '\n' }

// printTable renders t through kubectl's table printer, which hides the
// columns of priority above 0 unless wide and escapes terminal control
// sequences in cells.
func (o *OutputFlag) printTable(w io.Writer, t Table) error {
	if len(t.Rows) == 0 {
		if o.NoHeaders || t.Empty == "" {
			return nil
		}
		_, err := fmt.Fprintln(w, t.Empty)
		return err
	}
	mt := &metav1.Table{}
	for _, c := range t.Columns {
		mt.ColumnDefinitions = append(mt.ColumnDefinitions, metav1.TableColumnDefinition{Name: c.Name, Type: "string", Priority: c.Priority})
	}
	for _, r := range t.Rows {
		mt.Rows = append(mt.Rows, metav1.TableRow{Cells: r.Cells})
	}
	if !o.NoHeaders {
		if _, err := io.WriteString(w, t.Before); err != nil {
			return err
		}
	}
	p := printers.NewTablePrinter(printers.PrintOptions{Wide: o.Format == OutputWide, NoHeaders: o.NoHeaders})
	if err := p.PrintObj(mt, w); err != nil {
		return err
	}
	if !o.NoHeaders {
		_, err := io.WriteString(w, t.After)
		return err
	}
	return nil
}

// printNames is -o name: each named row's name on a line of its own,
// bare, as the commands take them as arguments. (kubectl's NamePrinter
// writes kind/name, which no trustbridge command accepts.)
func printNames(w io.Writer, t Table) error {
	named := false
	for _, r := range t.Rows {
		if r.Name == "" {
			continue
		}
		named = true
		if _, err := fmt.Fprintln(w, Printable(r.Name)); err != nil {
			return err
		}
	}
	if !named && len(t.Rows) > 0 {
		return errors.New("-o name: this command's rows have no names; use -o jsonpath=TEMPLATE to pick fields")
	}
	return nil
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
