package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/trustbridge/trustbridge/internal/server/flagenv"
	"github.com/trustbridge/trustbridge/internal/yamlcheck"
)

// maxConfigSize bounds a --config file.
const maxConfigSize = 1 << 20

// configFlag is the flag naming the config file; it is not a key in it.
const configFlag = "config"

// federationKey is the config file's inline list of federation endpoints,
// in the --federation-config schema.
const federationKey = "federation"

// envVars names, for the server's flags that have one, the environment
// variable that sets them (declared on the flags with flagenv.Bind). A set
// variable beats the config file, a flag beats both.
var envVars = map[string]string{
	"trust-domain": "TRUST_DOMAIN",
	"federate":     "SPIFFE_BUNDLE_ENDPOINTS",
	"namespace":    "POD_NAMESPACE",
}

// configFile is what a --config file held besides flag values.
type configFile struct {
	path string
	// federation is the file's federation list, for
	// federation.ParseConfigList (its nodes carry the file's line numbers);
	// nil without a federation key.
	federation *yaml.Node
	// trustPolicy is the file's trust policy, for trustpolicy.ParseNode;
	// nil without a trustPolicy key.
	trustPolicy *yaml.Node
	// oidc is the file's OIDC issuers, for oidc.ParseConfigNode; nil
	// without an oidc key.
	oidc *yaml.Node
}

// applyConfigFile reads the YAML file at path and sets every flag it names
// that was not given on the command line and whose environment variable
// is unset. Keys are flag names; values are scalars, or lists for list
// flags. Unknown or repeated keys, anchors and aliases, several documents
// and values of the wrong kind are errors naming the line and the key.
func applyConfigFile(fs *pflag.FlagSet, path string, getenv func(string) string) (*configFile, error) {
	data, err := readSmallFile(path, maxConfigSize)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	cf, err := applyConfig(fs, data, getenv)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	cf.path = path
	return cf, nil
}

// applyConfig is applyConfigFile on the file's bytes.
func applyConfig(fs *pflag.FlagSet, data []byte, getenv func(string) string) (*configFile, error) {
	root, err := configRoot(data)
	if err != nil {
		return nil, err
	}
	if root == nil {
		return &configFile{}, nil // nothing set
	}
	if n, _ := yamlcheck.Find(root, "", yamlcheck.IsAliasOrAnchor); n != nil {
		return nil, fmt.Errorf("line %d: YAML anchors and aliases are not allowed in a security configuration: write each value out", n.Line)
	}
	cf := &configFile{}
	settings, err := readSettings(fs, root, cf)
	if err != nil {
		return nil, err
	}
	// Values are checked first, and applied only if the whole file is
	// good: a bad file changes nothing. Each is checked on a scratch flag
	// of the same type.
	for _, s := range settings {
		if err := checkValues(s.flag, s.values); err != nil {
			return nil, fmt.Errorf("line %d: %s: %w", s.line, s.flag.Name, err)
		}
	}
	for _, s := range settings {
		if err := s.apply(getenv); err != nil {
			return nil, err
		}
	}
	return cf, nil
}

// configRoot decodes the file's one YAML document and returns its top
// mapping, nil for an empty file or document.
func configRoot(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	switch err := dec.Decode(&doc); {
	case errors.Is(err, io.EOF):
		return nil, nil // empty file: nothing set
	case err != nil:
		return nil, err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("line %d: a second YAML document; put everything in one mapping", extra.Line)
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: want a mapping of flag names to values, got %s", root.Line, nodeKind(root))
	}
	return root, nil
}

// setting is a flag's values from the config file.
type setting struct {
	flag   *pflag.Flag
	values []string
	line   int
}

// readSettings reads each key of root as a flag of fs, except the
// federation list, the trust policy and the OIDC issuers, which go to cf.
func readSettings(fs *pflag.FlagSet, root *yaml.Node, cf *configFile) ([]setting, error) {
	seen := map[string]int{}
	var settings []setting
	for i := 0; i < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("line %d: keys are flag names, got %s", k.Line, nodeKind(k))
		}
		key := k.Value
		if first, dup := seen[key]; dup {
			return nil, fmt.Errorf("line %d: key %q repeated (first on line %d)", k.Line, key, first)
		}
		seen[key] = k.Line
		if key == federationKey {
			if v.Kind != yaml.SequenceNode && v.Tag != "!!null" {
				return nil, fmt.Errorf("line %d: %s: want a list of endpoints, got %s", v.Line, key, nodeKind(v))
			}
			cf.federation = v
			continue
		}
		if key == trustPolicyKey {
			if err := readTrustPolicyNode(cf, k, v); err != nil {
				return nil, err
			}
			continue
		}
		if key == oidcKey {
			if err := readOIDCNode(cf, k, v); err != nil {
				return nil, err
			}
			continue
		}
		f := fs.Lookup(key)
		if f == nil || key == configFlag || key == "help" {
			return nil, fmt.Errorf("line %d: unknown key %q%s", k.Line, key, suggestFlag(fs, key))
		}
		values, err := settingValues(f, key, v)
		if err != nil {
			return nil, err
		}
		settings = append(settings, setting{flag: f, values: values, line: v.Line})
	}
	return settings, nil
}

// settingValues are the values v gives flag f: one scalar, or a list of
// scalars for a list flag.
func settingValues(f *pflag.Flag, key string, v *yaml.Node) ([]string, error) {
	switch v.Kind {
	case yaml.ScalarNode:
		if v.Tag == "!!null" {
			return nil, fmt.Errorf("line %d: %s: no value (remove the key to keep the default)", v.Line, key)
		}
		return []string{v.Value}, nil
	case yaml.SequenceNode:
		if !isListFlag(f) {
			return nil, fmt.Errorf("line %d: %s takes one value, not a list", v.Line, key)
		}
		var values []string
		for _, item := range v.Content {
			if item.Kind != yaml.ScalarNode || item.Tag == "!!null" {
				return nil, fmt.Errorf("line %d: %s: list items must be values, got %s", item.Line, key, nodeKind(item))
			}
			values = append(values, item.Value)
		}
		return values, nil
	default:
		return nil, fmt.Errorf("line %d: %s: want a value, got %s", v.Line, key, nodeKind(v))
	}
}

// apply sets the flag, unless the command line or its environment
// variable already did: they win over the file.
func (s setting) apply(getenv func(string) string) error {
	if s.flag.Changed {
		return nil
	}
	for _, env := range flagenv.Vars(s.flag) {
		if getenv(env) != "" {
			return nil
		}
	}
	if isListFlag(s.flag) {
		// pflag's list flags append after the first Set; the file
		// replaces the default instead.
		if sv, ok := s.flag.Value.(pflag.SliceValue); ok {
			if err := sv.Replace(s.values); err != nil {
				return fmt.Errorf("line %d: %s: %w", s.line, s.flag.Name, err)
			}
			return nil
		}
	}
	for _, val := range s.values {
		if err := s.flag.Value.Set(val); err != nil {
			return fmt.Errorf("line %d: %s: %w", s.line, s.flag.Name, err)
		}
	}
	return nil
}

// checkValues sets values on a fresh flag set holding a copy of f, so a
// bad value is found before any flag changes.
func checkValues(f *pflag.Flag, values []string) error {
	scratch := pflag.NewFlagSet("check", pflag.ContinueOnError)
	scratch.SetOutput(io.Discard)
	v := cloneValue(f)
	if v == nil {
		return nil // unknown type: Set reports at apply time
	}
	scratch.Var(v, f.Name, "")
	for _, val := range values {
		if err := v.Set(val); err != nil {
			return err
		}
	}
	return nil
}

// cloneValue returns a new, empty flag value of f's type.
func cloneValue(f *pflag.Flag) pflag.Value {
	fs := pflag.NewFlagSet("clone", pflag.ContinueOnError)
	switch f.Value.Type() {
	case "string":
		fs.String("x", "", "")
	case "bool":
		fs.Bool("x", false, "")
	case "duration":
		fs.Duration("x", 0, "")
	case "int":
		fs.Int("x", 0, "")
	case "int64":
		fs.Int64("x", 0, "")
	case "uint":
		fs.Uint("x", 0, "")
	case "uint64":
		fs.Uint64("x", 0, "")
	case "float64":
		fs.Float64("x", 0, "")
	case "stringSlice":
		fs.StringSlice("x", nil, "")
	case "stringArray":
		fs.StringArray("x", nil, "")
	default:
		if c, ok := f.Value.(interface{ clone() pflag.Value }); ok {
			return c.clone()
		}
		return nil
	}
	return fs.Lookup("x").Value
}

func isListFlag(f *pflag.Flag) bool {
	t := f.Value.Type()
	return strings.HasSuffix(t, "Slice") || strings.HasSuffix(t, "Array")
}

func nodeKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	if n.Tag == "!!null" {
		return "nothing"
	}
	return fmt.Sprintf("%q", n.Value)
}

// suggestFlag proposes the flag a misspelt key probably means.
func suggestFlag(fs *pflag.FlagSet, key string) string {
	norm := func(s string) string { return strings.ToLower(strings.NewReplacer("_", "-", ".", "-").Replace(s)) }
	var names []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name != configFlag && f.Name != "help" {
			names = append(names, f.Name)
		}
	})
	sort.Strings(names)
	if i := slices.IndexFunc(names, func(n string) bool { return norm(n) == norm(key) }); i >= 0 {
		return fmt.Sprintf(" (did you mean %q?)", names[i])
	}
	best, bestD := "", 3
	for _, n := range names {
		if d := flagenv.Levenshtein(norm(key), n); d < bestD {
			best, bestD = n, d
		}
	}
	if best != "" {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	return "; keys are the flags of trustbridge server --help, without the dashes"
}
