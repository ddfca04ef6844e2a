package main

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"
)

// credentialsDirFlag names, in ca issue, ca request and agent alike, the
// directory holding a workload's key.pem, cert-chain.pem and root-cert.pem
// (Istio's workload-spiffe-credentials).
const credentialsDirFlag = "credentials-dir"

// oldName is a flag's previous name, kept for a release: hidden, it warns
// on stderr (never stdout, where a script may read the output) and merge
// moves its value to the new flag.
type oldName struct {
	cmd      *cobra.Command
	old, new string
	value    string
	set      bool
}

// addOldName registers --old as a deprecated name of --new, a directory.
func addOldName(cmd *cobra.Command, old, new string) *oldName {
	n := &oldName{cmd: cmd, old: old, new: new}
	cmd.Flags().Var(n, old, "deprecated: use --"+new)
	_ = cmd.Flags().MarkHidden(old)
	return n
}

func (n *oldName) String() string { return n.value }
func (n *oldName) Type() string   { return "string" }
func (n *oldName) Set(s string) error {
	n.value, n.set = s, true
	fmt.Fprintf(n.cmd.ErrOrStderr(), "trustbridge: --%s is deprecated and goes in a later release; use --%s\n", n.old, n.new)
	return nil
}

// merge puts the old flag's value in dst, the new flag's variable, and
// marks the new flag given: a flag by either name beats its environment
// variable. Both given, naming different directories, is an error: which
// one was meant cannot be known. hint, when set, says what to pass
// instead.
func (n *oldName) merge(dst *string, hint string) error {
	if !n.set {
		return nil
	}
	if n.cmd.Flags().Changed(n.new) && filepath.Clean(*dst) != filepath.Clean(n.value) {
		if hint == "" {
			hint = fmt.Sprintf("pass only --%s", n.new)
		}
		return fmt.Errorf("--%s %s and --%s %s: --%s is the old name of --%s; %s", n.old, n.value, n.new, *dst, n.old, n.new, hint)
	}
	*dst = n.value
	n.cmd.Flags().Lookup(n.new).Changed = true
	return nil
}
