package main

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/agent"
	"github.com/trustbridge/trustbridge/internal/server/flagenv"
)

// agentEnv are the istio-agent environment variables (pilot-agent's
// options) whose meaning the agent's flags share. Where the meaning
// differs in part, the flag's help says how, and config refuses what it
// cannot honour.
var agentEnv = map[string]string{
	"ca-addr":                   "CA_ADDR",
	"root-cert":                 "CA_ROOT_CA",
	cli.CredentialsDirFlag:      "OUTPUT_CERTS",
	"prov-cert":                 "PROV_CERT",
	"file-mounted-certs":        "FILE_MOUNTED_CERTS",
	"secret-grace-period-ratio": "SECRET_GRACE_PERIOD_RATIO",
	"ttl":                       "SECRET_TTL",
	"trust-domain":              "TRUST_DOMAIN",
	"node-name":                 "NODE_NAME",
}

// fromFlags completes o after parsing: the environment for flags not
// given, --output-certs (the old name of --credentials-dir), and whether
// --credentials-dir was given at all.
func fromFlags(o *agent.Config, f *pflag.FlagSet, outputCerts *cli.OldName, getenv func(string) string) error {
	if err := outputCerts.Merge(&o.CredentialsDir, fmt.Sprintf(
		"the agent now keeps its certificates in the directory it serves: pass --%s %s (what --output-certs said), or --file-mounted-certs --%s %s to serve those files without asking the CA",
		cli.CredentialsDirFlag, outputCerts.Value, cli.CredentialsDirFlag, o.CredentialsDir)); err != nil {
		return err
	}
	from, err := flagenv.Apply(f, getenv)
	if err != nil {
		return err
	}
	o.From = from
	if outputCerts.Given {
		o.Typed = map[string]string{cli.CredentialsDirFlag: outputCerts.Old}
	}
	o.KeepCerts = f.Changed(cli.CredentialsDirFlag)
	if f.Changed("sds-socket") && !f.Changed("workload-api-socket") {
		o.WorkloadSocket = filepath.Join(filepath.Dir(o.Socket), workloadSocketName)
	}
	return nil
}
