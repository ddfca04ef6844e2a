package cli

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"
)

// CredentialsDirFlag names, in ca issue, ca request and agent alike, the
// directory holding a workload's key.pem, cert-chain.pem and root-cert.pem
// (Istio's workload-spiffe-credentials).
const CredentialsDirFlag = "credentials-dir"

// OldName is a flag's previous name, kept for a release: hidden, it warns
// on stderr (never stdout, where a script may read the output) and merge
// moves its value to the new flag.
type OldName struct {
	cmd      *cobra.Command
	Old, new string
	Value    string
	Given    bool
}

// AddOldName registers --old as a deprecated name of --new, a directory.
func AddOldName(cmd *cobra.Command, old, new string) *OldName {
	n := &OldName{cmd: cmd, Old: old, new: new}
	cmd.Flags().Var(n, old, "deprecated: use --"+new)
	_ = cmd.Flags().MarkHidden(old)
	return n
}

func (n *OldName) String() string { return n.Value }
func (n *OldName) Type() string   { return "string" }
func (n *OldName) Set(s string) error {
	n.Value, n.Given = s, true
	fmt.Fprintf(n.cmd.ErrOrStderr(), "trustbridge: --%s is deprecated and goes in a later release; use --%s\n", n.Old, n.new)
	return nil
}

// Merge puts the old flag's value in dst, the new flag's variable, and
// marks the new flag given: a flag by either name beats its environment
// variable. Both given, naming different directories, is an error: which
// one was meant cannot be known. hint, when set, says what to pass
// instead.
func (n *OldName) Merge(dst *string, hint string) error {
	if !n.Given {
		return nil
	}
	if n.cmd.Flags().Changed(n.new) && filepath.Clean(*dst) != filepath.Clean(n.Value) {
		if hint == "" {
			hint = fmt.Sprintf("pass only --%s", n.new)
		}
		return fmt.Errorf("--%s %s and --%s %s: --%s is the old name of --%s; %s", n.Old, n.Value, n.new, *dst, n.Old, n.new, hint)
	}
	*dst = n.Value
	n.cmd.Flags().Lookup(n.new).Changed = true
	return nil
}

// CountTrue is how many of bs are true.
func CountTrue(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}
