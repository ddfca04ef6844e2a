package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// credentialsDirFlag names, in ca issue, ca request and agent alike, the
// directory holding a workload's key.pem, cert-chain.pem and root-cert.pem
// (Istio's workload-spiffe-credentials).
const credentialsDirFlag = "credentials-dir"

// envAnnotation is the pflag annotation naming the environment variables
// that set a flag. One mechanism for every command: trustbridge server's
// TRUST_DOMAIN and the agent's Istio names alike are declared with
// bindEnv, and docs/configuration.md lists what it declares.
const envAnnotation = "trustbridge/env"

// bindEnv declares that the variables names set flag name (the first set
// one wins) and lists them in the flag's help.
func bindEnv(fs *pflag.FlagSet, name string, names ...string) {
	f := fs.Lookup(name)
	if f == nil {
		panic("bindEnv: no flag --" + name)
	}
	_ = fs.SetAnnotation(name, envAnnotation, names)
	if !strings.Contains(f.Usage, "env "+names[0]) {
		f.Usage += " (env " + strings.Join(names, ", ") + ")"
	}
}

// flagEnv is the environment variables that set f, if any.
func flagEnv(f *pflag.Flag) []string { return f.Annotations[envAnnotation] }

// applyEnv sets every flag not given on the command line from its
// environment variable, if set and not empty: a flag beats its variable,
// which beats the default. An invalid value is an error naming the
// variable. It returns, per flag it set, the variable that set it.
func applyEnv(fs *pflag.FlagSet, getenv func(string) string) (map[string]string, error) {
	from := map[string]string{}
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed {
			return
		}
		for _, name := range flagEnv(f) {
			v := getenv(name)
			if v == "" {
				continue
			}
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q (for --%s): %w", name, v, f.Name, e)
				return
			}
			from[f.Name] = name
			return
		}
	})
	return from, err
}

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
