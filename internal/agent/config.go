package agent

import (
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/svidcheck"
	"github.com/trustbridge/trustbridge/sds"
	sdsagent "github.com/trustbridge/trustbridge/sds/agent"
)

// Source names where a flag's value came from, for errors: the
// environment variable that set it, else the flag by the name typed.
func (o Config) Source(flag string, value any) string {
	if env, ok := o.From[flag]; ok {
		return fmt.Sprintf("%s=%v", env, value)
	}
	if old, ok := o.Typed[flag]; ok {
		flag = old
	}
	return fmt.Sprintf("--%s %v", flag, value)
}

// AgentConfig checks o and builds the agent's configuration; its parts log on
// base, each with its own component.
func (o Config) AgentConfig(base *slog.Logger, reg prometheus.Registerer) (sdsagent.Config, error) {
	if err := o.check(); err != nil {
		return sdsagent.Config{}, err
	}
	rootCA, err := o.rootCAMode()
	if err != nil {
		return sdsagent.Config{}, err
	}
	cfg := sdsagent.Config{
		SocketPath:             o.Socket,
		SocketGroup:            o.SocketGroup,
		WorkloadAPISocket:      o.WorkloadSocket,
		WorkloadAPISocketGroup: o.WorkloadSocketGroup,
		CredentialsDir:         o.CredentialsDir,
		PollInterval:           o.PollInterval,
		RootCA:                 rootCA,
		Logger:                 base.With(logattr.Component, "agent"),
		Registerer:             reg,
	}
	if o.Node.Enabled && (o.CAAddr == "" || o.FileMounted) {
		return sdsagent.Config{}, fmt.Errorf("%s serves each workload of the node a certificate from the CA: it needs --ca-addr (and not --file-mounted-certs)", nodeFlag)
	}
	if o.CAAddr == "" || o.FileMounted {
		if o.CAAddr != "" {
			cfg.Logger.Info("file-mounted certificates: the CA is not used", logattr.Address, o.CAAddr, "credentials_dir", o.CredentialsDir)
		}
		return cfg, nil
	}
	rc, err := o.rotatorConfig(base, reg)
	if err != nil {
		return sdsagent.Config{}, err
	}
	cfg.Rotator = rc
	if o.Node.Enabled {
		td, err := nodeTrustDomain(rc.ServerID, rc)
		if err != nil {
			return sdsagent.Config{}, err
		}
		if cfg.Node, err = o.nodeConfig(base, reg, td); err != nil {
			return sdsagent.Config{}, err
		}
	}
	// --output-certs and OUTPUT_CERTS always meant "write here"; only
	// --credentials-dir used to mean "serve these", so only it is guarded.
	cfg.AdoptCredentialsDir = o.Typed[credentialsDirFlag] != "" || o.From[credentialsDirFlag] != ""
	return cfg, nil
}

// check refuses values the agent cannot honour, naming the flag or the
// variable they came from.
func (o Config) check() error {
	if !(o.GraceRatio > 0 && o.GraceRatio < 1) {
		return fmt.Errorf("%s: want a number between 0 and 1", o.Source("secret-grace-period-ratio", o.GraceRatio))
	}
	if o.TTL < 0 || o.TTL%time.Second != 0 {
		return fmt.Errorf("%s: want a whole, positive number of seconds", o.Source("ttl", o.TTL))
	}
	if o.PollInterval <= 0 {
		return fmt.Errorf("--credentials-poll-interval %s must be positive", o.PollInterval)
	}
	if !o.Node.Enabled && (o.Node.BrokerSocket != "" || len(o.Node.BrokerAllow) > 0) {
		return fmt.Errorf("--broker-socket and --broker-allow need %s: brokers get the identities of the workloads a node agent attests", nodeFlag)
	}
	noCA := o.CAAddr == "" || o.FileMounted
	switch {
	case noCA && o.From[credentialsDirFlag] != "":
		return fmt.Errorf("%s: OUTPUT_CERTS is where certificates from the CA are written, and no CA is used (%s); pass --%s for the files to serve",
			o.Source(credentialsDirFlag, o.CredentialsDir), noCAReason(o), credentialsDirFlag)
	case noCA && o.ProvCert != "":
		return fmt.Errorf("%s: a provisioning certificate authenticates to the CA, and no CA is used (%s)", o.Source("prov-cert", o.ProvCert), noCAReason(o))
	}
	return nil
}

// rootCAMode is --rootca; empty means the default: spiffe for a node
// agent, whose callers are Istio's sidecars asking for ROOTCA alone,
// local for one workload (as before the flag).
func (o Config) rootCAMode() (sds.RootCAMode, error) {
	if o.RootCA == "" {
		if o.Node.Enabled {
			return sds.RootCASPIFFE, nil
		}
		return sds.RootCALocal, nil
	}
	m, err := sds.ParseRootCAMode(o.RootCA)
	if err != nil {
		return "", fmt.Errorf("%s: want %s or %s", o.Source(rootCAFlag, o.RootCA), sds.RootCALocal, sds.RootCASPIFFE)
	}
	return m, nil
}

func noCAReason(o Config) string {
	if o.FileMounted {
		return o.Source("file-mounted-certs", true)
	}
	return "no --ca-addr or CA_ADDR"
}

func (o Config) rotatorConfig(base *slog.Logger, reg prometheus.Registerer) (*sdsagent.RotatorConfig, error) {
	if o.RootCert == "" {
		return nil, errors.New("--ca-addr needs --root-cert (or CA_ROOT_CA): the roots that vouch for the server on the first connection")
	}
	if strings.EqualFold(o.RootCert, "SYSTEM") {
		return nil, fmt.Errorf("%s: the system's web roots cannot vouch for trustbridge's certificate service, which presents an X509-SVID; give the PEM file of the server trust domain's roots", o.Source("root-cert", o.RootCert))
	}
	roots, err := caclient.ReadPEMCerts(o.RootCert)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.Source("root-cert", o.RootCert), err)
	}
	serverID, err := o.expectedServerID()
	if err != nil {
		return nil, err
	}
	if err := o.checkRootsFor(serverID, roots); err != nil {
		return nil, err
	}
	rc := &sdsagent.RotatorConfig{
		CAAddr:      o.CAAddr,
		Roots:       roots,
		ServerID:    serverID,
		TokenFile:   o.TokenFile,
		ProvCertDir: o.ProvCert,
		GraceRatio:  o.GraceRatio,
		TTL:         o.TTL,
		Logger:      base.With(logattr.Component, "rotator"),
		Registerer:  reg,
	}
	if o.KeepCerts {
		rc.OutputCertsDir = o.CredentialsDir
	}
	return rc, nil
}

// checkRootsFor refuses --root-cert when its roots all name trust
// domains (trustbridge's and SPIRE's do) and none is serverID's: they
// could never verify the certificate service, and the agent would retry
// for ever. A root naming none (a plug-in CA's) may be any trust domain's;
// the first handshake tells (caclient.ErrServerTrustDomain).
func (o Config) checkRootsFor(serverID spiffeid.ID, roots []*x509.Certificate) error {
	named, anonymous := svidcheck.RootTrustDomains(roots)
	td := serverID.TrustDomain()
	if serverID.IsZero() || anonymous || len(named) == 0 || slices.Contains(named, td) {
		return nil
	}
	names := make([]string, len(named))
	for i, n := range named {
		names[i] = n.Name()
	}
	given, fix := o.Source("trust-domain", o.TrustDomain), "--trust-domain "+names[0]
	if o.ServerID != "" {
		given, fix = o.Source("server-spiffe-id", o.ServerID), "a --server-spiffe-id in "+names[0]
	}
	if len(named) > 1 {
		fix = "the trust domain of one of them"
	}
	return fmt.Errorf("%s holds roots of %s, not of %s (%s): use %s, or give %s's roots (trustbridge bundle show -o pem on its server)",
		o.Source("root-cert", o.RootCert), strings.Join(names, ", "), td.Name(), given, fix, td.Name())
}

// expectedServerID is --server-spiffe-id, else the certificate service's
// ID in --trust-domain, else zero (derived from the roots).
func (o Config) expectedServerID() (spiffeid.ID, error) {
	var td spiffeid.TrustDomain
	if o.TrustDomain != "" {
		var err error
		if td, err = bundledoc.TrustDomainName(o.TrustDomain); err != nil {
			return spiffeid.ID{}, fmt.Errorf("%s: %w", o.Source("trust-domain", o.TrustDomain), err)
		}
	}
	if o.ServerID == "" {
		if td.IsZero() {
			return spiffeid.ID{}, nil
		}
		return spiffeid.FromPath(td, server.GRPCServingPath)
	}
	id, err := spiffeid.FromString(o.ServerID)
	if err != nil {
		return id, fmt.Errorf("--server-spiffe-id %q: %w", o.ServerID, err)
	}
	if !td.IsZero() && !id.MemberOf(td) {
		return id, fmt.Errorf("--server-spiffe-id %s is not in %s", id, o.Source("trust-domain", o.TrustDomain))
	}
	return id, nil
}
