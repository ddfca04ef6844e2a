package flagenv

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// Annotation is the pflag annotation naming the environment variables
// that set a flag. One mechanism for every command: trustbridge server's
// TRUST_DOMAIN and the agent's Istio names alike are declared with
// Bind, and docs/configuration.md lists what it declares.
const Annotation = "trustbridge/env"

// Bind declares that the variables names set flag name (the first set
// one wins) and lists them in the flag's help.
func Bind(fs *pflag.FlagSet, name string, names ...string) {
	f := fs.Lookup(name)
	if f == nil {
		panic("bindEnv: no flag --" + name)
	}
	_ = fs.SetAnnotation(name, Annotation, names)
	if !strings.Contains(f.Usage, "env "+names[0]) {
		f.Usage += " (env " + strings.Join(names, ", ") + ")"
	}
}

// Vars is the environment variables that set f, if any.
func Vars(f *pflag.Flag) []string { return f.Annotations[Annotation] }

// Apply sets every flag not given on the command line from its
// environment variable, if set and not empty: a flag beats its variable,
// which beats the default. An invalid value is an error naming the
// variable. It returns, per flag it set, the variable that set it.
func Apply(fs *pflag.FlagSet, getenv func(string) string) (map[string]string, error) {
	from := map[string]string{}
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed {
			return
		}
		for _, name := range Vars(f) {
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

// Levenshtein is the edit distance (insertions, deletions,
// substitutions) between a and b, by byte: flag names are ASCII.
func Levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
