package cli

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type peer struct {
	Name     string `json:"name"`
	Sequence uint64 `json:"sequence"`
	Profile  string `json:"profile"`
}

var peers = []peer{{"west.example", 1234567890, "https_spiffe"}, {"north.example", 7, "https_web"}}

func peerTable() Table {
	t := Table{
		Columns: []Column{{Name: "Trust domain"}, {Name: "Seq"}, {Name: "Profile", Priority: 1}},
		Before:  "2 peers\n",
		After:   "\nend of list\n",
		Empty:   "no peers",
	}
	for _, p := range peers {
		t.Rows = append(t.Rows, Row{Name: p.Name, Cells: []any{p.Name, p.Sequence, p.Profile}})
	}
	return t
}

// flagWith parses args into a command's -o and --no-headers, as cobra
// would.
func flagWith(t *testing.T, args ...string) *OutputFlag {
	t.Helper()
	cmd := &cobra.Command{Use: "x"}
	cmd.SetErr(io.Discard)
	o := AddOutputFlag(cmd)
	require.NoError(t, cmd.Flags().Parse(args))
	return o
}

func printed(t *testing.T, o *OutputFlag, v any, tb Table) (string, error) {
	t.Helper()
	var b bytes.Buffer
	err := o.Print(&b, v, tb)
	return b.String(), err
}

func TestPrintFormats(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"table", nil, "2 peers\nTRUST DOMAIN    SEQ\nwest.example    1234567890\nnorth.example   7\n\nend of list\n"},
		{"wide", []string{"-o", "wide"}, "2 peers\nTRUST DOMAIN    SEQ          PROFILE\nwest.example    1234567890   https_spiffe\nnorth.example   7            https_web\n\nend of list\n"},
		{"no headers", []string{"--no-headers"}, "west.example    1234567890\nnorth.example   7\n"},
		{"wide no headers", []string{"-o", "wide", "--no-headers"}, "west.example    1234567890   https_spiffe\nnorth.example   7            https_web\n"},
		{"name", []string{"-o", "name"}, "west.example\nnorth.example\n"},
		{"json", []string{"-o", "json"}, "[\n  {\n    \"name\": \"west.example\",\n    \"sequence\": 1234567890,\n    \"profile\": \"https_spiffe\"\n  },\n  {\n    \"name\": \"north.example\",\n    \"sequence\": 7,\n    \"profile\": \"https_web\"\n  }\n]\n"},
		{"yaml", []string{"-o", "yaml"}, "- name: west.example\n  profile: https_spiffe\n  sequence: 1234567890\n- name: north.example\n  profile: https_web\n  sequence: 7\n"},
		{"jsonpath", []string{"-o", `jsonpath={range [*]}{.name}={.sequence}{"\n"}{end}`}, "west.example=1234567890\nnorth.example=7\n"},
		{"jsonpath root as jq writes it", []string{"-o", "jsonpath={.[*].name}"}, "west.example north.example"},
		{"jsonpath filter", []string{"-o", `jsonpath={.[?(@.profile=="https_web")].sequence}`}, "7"},
		{"jsonpath missing key", []string{"-o", "jsonpath={[0].nope}"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := printed(t, flagWith(t, tt.args...), peers, peerTable())
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestPrintEmptyTable(t *testing.T) {
	empty := Table{Columns: []Column{{Name: "Trust domain"}}, Before: "0 peers\n", Empty: "no peers"}
	got, err := printed(t, flagWith(t), []peer{}, empty)
	require.NoError(t, err)
	assert.Equal(t, "no peers\n", got)
	got, err = printed(t, flagWith(t, "--no-headers"), []peer{}, empty)
	require.NoError(t, err)
	assert.Empty(t, got, "a script reading rows gets none")
	got, err = printed(t, flagWith(t, "-o", "name"), []peer{}, empty)
	require.NoError(t, err)
	assert.Empty(t, got)
}

// Cells from untrusted documents cannot drive the terminal: the printer
// escapes ESC, and a newline cannot forge a row.
func TestPrintEscapesCells(t *testing.T) {
	tb := Table{Columns: []Column{{Name: "Subject"}, {Name: "N"}}, Rows: []Row{{Name: "a", Cells: []any{"\x1b[2Jevil\nforged   row", 1}}}}
	got, err := printed(t, flagWith(t, "--no-headers"), nil, tb)
	require.NoError(t, err)
	assert.NotContains(t, got, "\x1b")
	assert.Equal(t, 1, strings.Count(got, "\n"), got)
}

// jsonpath output prints a document's strings raw, so they are escaped
// there: a peer-controlled subject cannot clear the screen (ESC), rewrite
// the line (CR) or ring the bell; tab and newline stay, and the template's
// own text is left alone.
func TestJSONPathEscapesControls(t *testing.T) {
	doc := []map[string]any{{"subject": "CN=\x1b[2Jevil\r\a\x7f\u009b\tok\nline", "n": 1, "keys": []any{"k\x1b]0;title\a"}}}
	got, err := printed(t, flagWith(t, "-o", `jsonpath={range [*]}{.subject}|{.keys[0]}{"\n"}{end}`), doc, Table{})
	require.NoError(t, err)
	assert.Equal(t, "CN=\\x1b[2Jevil\\r\\a\\x7f\\u009b\tok\nline|k\\x1b]0;title\\a\n", got)
	assert.NotContains(t, got, "\x1b")
}

func TestPrintNameNeedsNames(t *testing.T) {
	tb := Table{Columns: []Column{{Name: "Finding"}}, Rows: []Row{{Cells: []any{"x"}}}}
	_, err := printed(t, flagWith(t, "-o", "name"), nil, tb)
	assert.EqualError(t, err, "-o name: this command's rows have no names; use -o jsonpath=TEMPLATE to pick fields")
}

func TestCheckRefuses(t *testing.T) {
	tests := []struct{ format, want string }{
		{"pem", `-o "pem": want table, wide, name, json, yaml or jsonpath=TEMPLATE`},
		{"jsonpath", `-o jsonpath: give the template after "="`},
		{"jsonpath=", "-o jsonpath=: the template is empty"},
		{"jsonpath=  ", "-o jsonpath=: the template is empty"},
		{"jsonpath={.name", "-o jsonpath={.name: unclosed action; templates look like '{.trust_domain}'"},
		{"jsonpath={.a[}", "-o jsonpath={.a[}: unterminated array"},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			o := flagWith(t, "-o", tt.format)
			err := o.Check()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			_, err = printed(t, o, peers, peerTable())
			require.Error(t, err, "Print checks too")
		})
	}
}

// An index past the end is an error at run time, naming the format.
func TestJSONPathExecuteError(t *testing.T) {
	_, err := printed(t, flagWith(t, "-o", "jsonpath={[5].name}"), peers, peerTable())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "-o jsonpath={[5].name}: ")
}

// Write keeps the hand-written tables of commands not yet on Print:
// table and wide call the function, documents are encoded, and what needs
// a Table's rows refuses clearly.
func TestWriteCompatibility(t *testing.T) {
	table := func(w io.Writer) error {
		_, err := io.WriteString(w, "HAND WRITTEN\n")
		return err
	}
	write := func(args ...string) (string, error) {
		var b bytes.Buffer
		err := flagWith(t, args...).Write(&b, peers, table)
		return b.String(), err
	}
	for _, args := range [][]string{nil, {"-o", "wide"}} {
		got, err := write(args...)
		require.NoError(t, err)
		assert.Equal(t, "HAND WRITTEN\n", got)
	}
	got, err := write("-o", "jsonpath={[1].name}")
	require.NoError(t, err)
	assert.Equal(t, "north.example", got)
	_, err = write("-o", "name")
	assert.EqualError(t, err, "-o name: this command prints no list of named things; use -o jsonpath=TEMPLATE to pick fields")
	_, err = write("--no-headers")
	assert.ErrorContains(t, err, "--no-headers: this command's table has no header line to leave out")
}

func TestHumanAndCommon(t *testing.T) {
	for _, tt := range []struct {
		format        string
		human, common bool
	}{
		{"table", true, true}, {"wide", true, true}, {"name", false, true}, {"json", false, true},
		{"yaml", false, true}, {"jsonpath={.a}", false, true}, {"pem", false, false},
	} {
		o := &OutputFlag{Format: tt.format}
		assert.Equal(t, tt.human, o.Human(), tt.format)
		assert.Equal(t, tt.common, o.Common(), tt.format)
	}
}

// FuzzJSONPathTemplate: whatever -o jsonpath=TEMPLATE a user types, the
// CLI refuses it or prints, never panics, and a template Check accepted
// runs over a status-like document without panicking either.
func FuzzJSONPathTemplate(f *testing.F) {
	for _, s := range []string{
		"{.trust_domain}", `{range .[*]}{.trust_domain}{"\n"}{end}`, "{[*].sequence}", `{.[?(@.state=="failing")].last_error}`,
		"{.a[}", "{.[?(@.s==}", "{range .[*]}{end}{end}", "{..name}", "{.[-1:]}", "{.[0:2:0]}", "{@}", "{$}", "text {.x} text", "{",
	} {
		f.Add(s)
	}
	doc := []map[string]any{{"trust_domain": "west.example", "sequence": 1234567890, "state": "ok", "authorities": []any{}},
		{"trust_domain": "north.example", "sequence": nil, "state": "failing", "last_error": "refused"}}
	f.Fuzz(func(t *testing.T, tmpl string) {
		o := &OutputFlag{Format: OutputJSONPath + "=" + tmpl, allowed: []string{OutputTable}}
		if err := o.Check(); err != nil {
			if !strings.HasPrefix(err.Error(), "-o jsonpath") {
				t.Fatalf("error does not name the flag: %v", err)
			}
			return
		}
		_ = o.Print(io.Discard, doc, Table{})
	})
}
