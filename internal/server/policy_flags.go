package server

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// trustPolicyKey is the config file's trust policy, in the --trust-policy
// file's schema.
const trustPolicyKey = "trustPolicy"

// defaultPolicyPoll is how often --trust-policy is checked by default.
const defaultPolicyPoll = time.Second

// PolicyConfig are the trust policy's flags and the --config file's
// trustPolicy section.
type PolicyConfig struct {
	File    string
	Default string
	Poll    time.Duration
	// inline is the trustPolicy section of the --config file inlineFrom,
	// with that file's line numbers; nil without one.
	inline     *yaml.Node
	inlineFrom string
}

func addPolicyFlags(f *pflag.FlagSet, o *PolicyConfig) {
	f.StringVar(&o.File, "trust-policy", "", "trust policy file (YAML: default, rules) saying which local workloads may trust which federated trust domains and peers (docs/trust-policy.md); polled and reloaded on change and on SIGHUP, a bad change keeps the last good policy. Without any policy every workload trusts every federated trust domain")
	f.StringVar(&o.Default, "trust-policy-default", "allow", `what a federated trust domain no rule names gets: allow (every workload trusts it, the behaviour without a policy) or deny (only the local trust domain until a rule grants more). The strictest of this and the policy documents' default: wins`)
	f.DurationVar(&o.Poll, "trust-policy-poll-interval", defaultPolicyPoll, "how often --trust-policy is checked for changes")
}

// readTrustPolicyNode takes the config file's trustPolicy value: a
// mapping in the policy file's schema, or nothing.
func readTrustPolicyNode(cf *configFile, k, v *yaml.Node) error {
	if v.Kind != yaml.MappingNode && v.Tag != "!!null" {
		return fmt.Errorf("line %d: %s: want a policy (default, rules), got %s", v.Line, k.Value, nodeKind(v))
	}
	if v.Kind == yaml.MappingNode {
		cf.trustPolicy = v
	}
	return nil
}
