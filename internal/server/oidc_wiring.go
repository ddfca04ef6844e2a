package server

import (
	"crypto/x509"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.yaml.in/yaml/v3"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/authn/oidc"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/pemfile"
)

// oidcKey is the config file's OIDC issuers, in the --oidc-config file's
// schema (a mapping with an issuers list).
const oidcKey = "oidc"

// maxIssuerCAFile bounds an issuer's caFile.
const maxIssuerCAFile = 1 << 20

// OIDCConfig are --oidc-config and the --config file's oidc section.
type OIDCConfig struct {
	File string
	// inline is the oidc section of the --config file inlineFrom, with
	// that file's line numbers; nil without one.
	inline     *yaml.Node
	inlineFrom string
}

func addOIDCFlags(f *pflag.FlagSet, o *OIDCConfig) {
	f.StringVar(&o.File, "oidc-config", "", "YAML file of OIDC and remote Kubernetes issuers whose JWTs authenticate callers (issuers: [{name, kind: oidc|kubernetes, issuer, audiences, claims, spiffeID}], docs/oidc-issuers.md): "+
		"CI jobs, VMs and clouds with a platform token, pods of clusters without TokenReview; keys come from each issuer's discovery document and JWKS, checked offline. "+
		"Read at start; the --config file's oidc key holds the same")
}

// readOIDCNode takes the config file's oidc value: a mapping in the
// --oidc-config file's schema, or nothing.
func readOIDCNode(cf *configFile, k, v *yaml.Node) error {
	if v.Kind != yaml.MappingNode && v.Tag != "!!null" {
		return fmt.Errorf("line %d: %s: want a mapping with an issuers list, got %s", v.Line, k.Value, nodeKind(v))
	}
	if v.Kind == yaml.MappingNode {
		cf.oidc = v
	}
	return nil
}

// loadIssuers reads the issuers from --oidc-config or the --config file's
// oidc section, and each issuer's caFile. None configured is nil, nil.
func (o OIDCConfig) loadIssuers() ([]oidc.IssuerConfig, error) {
	var issuers []oidc.IssuerConfig
	switch {
	case o.File != "" && o.inline != nil:
		return nil, fmt.Errorf("config %s: an %s section and --oidc-config do not combine; keep one", o.inlineFrom, oidcKey)
	case o.File != "":
		data, err := readSmallFile(o.File, maxConfigSize)
		if err != nil {
			return nil, fmt.Errorf("--oidc-config: %w", err)
		}
		if issuers, err = oidc.ParseConfig(data); err != nil {
			return nil, fmt.Errorf("--oidc-config %s: %w", o.File, err)
		}
	case o.inline != nil:
		var err error
		if issuers, err = oidc.ParseConfigNode(o.inline); err != nil {
			return nil, fmt.Errorf("config %s: %s: %w", o.inlineFrom, oidcKey, err)
		}
	}
	for i := range issuers {
		if err := loadIssuerRoots(&issuers[i]); err != nil {
			return nil, fmt.Errorf("%s: %w", o.source(), err)
		}
	}
	return issuers, nil
}

// source names where the issuers came from, for errors.
func (o OIDCConfig) source() string {
	if o.File != "" {
		return "--oidc-config " + o.File
	}
	return "config " + o.inlineFrom + ": " + oidcKey
}

// loadIssuerRoots reads an issuer's caFile into its Roots.
func loadIssuerRoots(ic *oidc.IssuerConfig) error {
	if ic.CAFile == "" {
		return nil
	}
	data, err := readSmallFile(ic.CAFile, maxIssuerCAFile)
	if err != nil {
		return fmt.Errorf("issuer %q (line %d): caFile: %w", ic.Name, ic.Line, err)
	}
	certs, err := pemfile.ParseCertificates(data)
	if err != nil {
		return fmt.Errorf("issuer %q (line %d): caFile %s: %w", ic.Name, ic.Line, ic.CAFile, err)
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	ic.Roots = pool
	return nil
}

// oidcAuthenticator builds the authenticator of the configured issuers,
// with the grant checker that ends renewal chains of a removed issuer;
// nil when none is configured.
func (g *grpcEndpoint) oidcAuthenticator(o GRPCConfig, td spiffeid.TrustDomain, reg prometheus.Registerer, logger *slog.Logger) (*oidc.Authenticator, error) {
	issuers, err := o.OIDC.loadIssuers()
	if err != nil || len(issuers) == 0 {
		return nil, err
	}
	a, err := oidc.New(oidc.Config{
		TrustDomain: td, Issuers: issuers,
		Logger: logger.With(logattr.Component, "oidc"), Registerer: reg,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.OIDC.source(), err)
	}
	g.oidc = a
	g.grantMap()[authn.MethodOIDC] = a
	g.grantMap()[authn.MethodKubernetesIssuer] = a
	g.runners = append(g.runners, a.Run)
	return a, nil
}

// checkOIDCIssuers is config check's look at the issuers: the file, each
// caFile, and everything oidc.New refuses (templates against the trust
// domain included), without fetching anything.
func checkOIDCIssuers(o OIDCConfig, td spiffeid.TrustDomain) error {
	issuers, err := o.loadIssuers()
	if err != nil || len(issuers) == 0 {
		return err
	}
	if _, err := oidc.New(oidc.Config{TrustDomain: td, Issuers: issuers}); err != nil {
		return fmt.Errorf("%s: %w", o.source(), err)
	}
	return nil
}
