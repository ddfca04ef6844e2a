package main

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/flagenv"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/sds/agent"
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
}

// fromFlags completes o after parsing: the environment for flags not
// given, --output-certs (the old name of --credentials-dir), and whether
// --credentials-dir was given at all.
func (o *agentOptions) fromFlags(f *pflag.FlagSet, outputCerts *cli.OldName, getenv func(string) string) error {
	if err := outputCerts.Merge(&o.credentialsDir, fmt.Sprintf(
		"the agent now keeps its certificates in the directory it serves: pass --%s %s (what --output-certs said), or --file-mounted-certs --%s %s to serve those files without asking the CA",
		cli.CredentialsDirFlag, outputCerts.Value, cli.CredentialsDirFlag, o.credentialsDir)); err != nil {
		return err
	}
	from, err := flagenv.Apply(f, getenv)
	if err != nil {
		return err
	}
	o.from = from
	if outputCerts.Given {
		o.typed = map[string]string{cli.CredentialsDirFlag: outputCerts.Old}
	}
	o.keepCerts = f.Changed(cli.CredentialsDirFlag)
	if f.Changed("sds-socket") && !f.Changed("workload-api-socket") {
		o.workloadSocket = filepath.Join(filepath.Dir(o.socket), workloadSocketName)
	}
	return nil
}

// source names where a flag's value came from, for errors: the
// environment variable that set it, else the flag by the name typed.
func (o agentOptions) source(flag string, value any) string {
	if env, ok := o.from[flag]; ok {
		return fmt.Sprintf("%s=%v", env, value)
	}
	if old, ok := o.typed[flag]; ok {
		flag = old
	}
	return fmt.Sprintf("--%s %v", flag, value)
}

// config checks o and builds the agent's configuration; its parts log on
// base, each with its own component.
func (o agentOptions) config(base *slog.Logger, reg prometheus.Registerer) (agent.Config, error) {
	if err := o.check(); err != nil {
		return agent.Config{}, err
	}
	cfg := agent.Config{
		SocketPath:             o.socket,
		SocketGroup:            o.socketGroup,
		WorkloadAPISocket:      o.workloadSocket,
		WorkloadAPISocketGroup: o.workloadSocketGroup,
		CredentialsDir:         o.credentialsDir,
		PollInterval:           o.pollInterval,
		Logger:                 base.With(logattr.Component, "agent"),
		Registerer:             reg,
	}
	if o.caAddr == "" || o.fileMounted {
		if o.caAddr != "" {
			cfg.Logger.Info("file-mounted certificates: the CA is not used", logattr.Address, o.caAddr, "credentials_dir", o.credentialsDir)
		}
		return cfg, nil
	}
	rc, err := o.rotatorConfig(base, reg)
	if err != nil {
		return agent.Config{}, err
	}
	cfg.Rotator = rc
	// --output-certs and OUTPUT_CERTS always meant "write here"; only
	// --credentials-dir used to mean "serve these", so only it is guarded.
	cfg.AdoptCredentialsDir = o.typed[cli.CredentialsDirFlag] != "" || o.from[cli.CredentialsDirFlag] != ""
	return cfg, nil
}

// check refuses values the agent cannot honour, naming the flag or the
// variable they came from.
func (o agentOptions) check() error {
	if !(o.graceRatio > 0 && o.graceRatio < 1) {
		return fmt.Errorf("%s: want a number between 0 and 1", o.source("secret-grace-period-ratio", o.graceRatio))
	}
	if o.ttl < 0 || o.ttl%time.Second != 0 {
		return fmt.Errorf("%s: want a whole, positive number of seconds", o.source("ttl", o.ttl))
	}
	if o.pollInterval <= 0 {
		return fmt.Errorf("--credentials-poll-interval %s must be positive", o.pollInterval)
	}
	noCA := o.caAddr == "" || o.fileMounted
	switch {
	case noCA && o.from[cli.CredentialsDirFlag] != "":
		return fmt.Errorf("%s: OUTPUT_CERTS is where certificates from the CA are written, and no CA is used (%s); pass --%s for the files to serve",
			o.source(cli.CredentialsDirFlag, o.credentialsDir), noCAReason(o), cli.CredentialsDirFlag)
	case noCA && o.provCert != "":
		return fmt.Errorf("%s: a provisioning certificate authenticates to the CA, and no CA is used (%s)", o.source("prov-cert", o.provCert), noCAReason(o))
	}
	return nil
}

func noCAReason(o agentOptions) string {
	if o.fileMounted {
		return o.source("file-mounted-certs", true)
	}
	return "no --ca-addr or CA_ADDR"
}

func (o agentOptions) rotatorConfig(base *slog.Logger, reg prometheus.Registerer) (*agent.RotatorConfig, error) {
	if o.rootCert == "" {
		return nil, errors.New("--ca-addr needs --root-cert (or CA_ROOT_CA): the roots that vouch for the server on the first connection")
	}
	if strings.EqualFold(o.rootCert, "SYSTEM") {
		return nil, fmt.Errorf("%s: the system's web roots cannot vouch for trustbridge's certificate service, which presents an X509-SVID; give the PEM file of the server trust domain's roots", o.source("root-cert", o.rootCert))
	}
	roots, err := cli.ReadPEMCerts(o.rootCert)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.source("root-cert", o.rootCert), err)
	}
	serverID, err := o.expectedServerID()
	if err != nil {
		return nil, err
	}
	rc := &agent.RotatorConfig{
		CAAddr:      o.caAddr,
		Roots:       roots,
		ServerID:    serverID,
		TokenFile:   o.tokenFile,
		ProvCertDir: o.provCert,
		GraceRatio:  o.graceRatio,
		TTL:         o.ttl,
		Logger:      base.With(logattr.Component, "rotator"),
		Registerer:  reg,
	}
	if o.keepCerts {
		rc.OutputCertsDir = o.credentialsDir
	}
	return rc, nil
}

// expectedServerID is --server-spiffe-id, else the certificate service's
// ID in --trust-domain, else zero (derived from the roots).
func (o agentOptions) expectedServerID() (spiffeid.ID, error) {
	var td spiffeid.TrustDomain
	if o.trustDomain != "" {
		var err error
		if td, err = bundledoc.TrustDomainName(o.trustDomain); err != nil {
			return spiffeid.ID{}, fmt.Errorf("%s: %w", o.source("trust-domain", o.trustDomain), err)
		}
	}
	if o.serverID == "" {
		if td.IsZero() {
			return spiffeid.ID{}, nil
		}
		return spiffeid.FromPath(td, server.GRPCServingPath)
	}
	id, err := spiffeid.FromString(o.serverID)
	if err != nil {
		return id, fmt.Errorf("--server-spiffe-id %q: %w", o.serverID, err)
	}
	if !td.IsZero() && !id.MemberOf(td) {
		return id, fmt.Errorf("--server-spiffe-id %s is not in %s", id, o.source("trust-domain", o.trustDomain))
	}
	return id, nil
}
