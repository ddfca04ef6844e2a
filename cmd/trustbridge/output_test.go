package main

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
)

func TestOutputFlag(t *testing.T) {
	type doc struct {
		TrustDomain string `json:"trust_domain"`
		Roots       int    `json:"roots"`
	}
	v := doc{TrustDomain: "example.org", Roots: 2}
	for _, tc := range []struct {
		args    []string
		want    string
		wantErr string
		warns   bool
	}{
		{args: nil, want: "TABLE\n"},
		{args: []string{"-o", "json"}, want: "{\n  \"trust_domain\": \"example.org\",\n  \"roots\": 2\n}\n"},
		{args: []string{"--output=yaml"}, want: "roots: 2\ntrust_domain: example.org\n"},
		{args: []string{"--json"}, want: "{\n  \"trust_domain\": \"example.org\",\n  \"roots\": 2\n}\n", warns: true},
		{args: []string{"-o", "pem"}, wantErr: `-o "pem": want table, wide, name, json, yaml, spiffe or jsonpath=TEMPLATE`},
		{args: []string{"-o", "spiffe"}, wantErr: "-o spiffe: not handled by this command"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			cmd := &cobra.Command{Use: "x", SilenceUsage: true, SilenceErrors: true}
			o := cli.AddOutputFlag(cmd, "spiffe")
			cmd.RunE = func(*cobra.Command, []string) error {
				return o.Write(&out, v, func(w io.Writer) error { _, err := io.WriteString(w, "TABLE\n"); return err })
			}
			cmd.SetErr(&errOut)
			cmd.SetOut(io.Discard)
			cmd.SetArgs(tc.args)
			err := cmd.Execute()
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Equal(t, tc.wantErr, err.Error())
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, out.String())
			assert.Equal(t, tc.warns, strings.Contains(errOut.String(), "use -o json"), "stderr: %s", errOut.String())
		})
	}
	cmd := &cobra.Command{Use: "x"}
	cli.AddOutputFlag(cmd)
	assert.True(t, cmd.Flags().Lookup("json").Hidden, "--json is hidden from help")
}
