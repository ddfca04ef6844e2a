package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

func newConfigCmd(e env) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "config",
		Short:   "Work with trustbridge server's --config file",
		Example: `  trustbridge config check /etc/trustbridge/config.yaml`,
	}
	check := &cobra.Command{
		Use:   "check FILE",
		Short: "Validate a server config file without starting anything",
		Long: `Read FILE as trustbridge server --config would, with the environment
variables that apply (TRUST_DOMAIN, SPIFFE_BUNDLE_ENDPOINTS, POD_NAMESPACE), and
check everything that can be checked without starting: unknown or repeated keys,
every value's type, the trust domain, the CA key type, the storage and flag
combinations, listen addresses, log settings and every federation endpoint
(including bootstrap bundles). A self-serving https_spiffe endpoint without a
bootstrap bundle passes only when the last-known-good store of --data-dir
holds its trust domain's bundle; with --storage kube, whose store is in
ConfigMaps, config check does not connect and needs the bootstrap bundle.
Prints "ok" or every problem found; the exit status is 1 on any problem.`,
		Example: `  trustbridge config check /etc/trustbridge/config.yaml
  TRUST_DOMAIN=example.org trustbridge config check deploy/base/config.yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var o serverOptions
			fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
			fs.SetOutput(io.Discard)
			addServerFlags(fs, &o)
			o.configPath = args[0]
			if err := loadServerConfig(fs, &o, os.Getenv); err != nil {
				return err
			}
			errs := checkServerOptions(o)
			if len(errs) == 0 {
				_, err := fmt.Fprintf(e.out, "%s: ok\n", args[0])
				return err
			}
			for _, err := range errs {
				fmt.Fprintf(e.out, "%s: %v\n", args[0], err)
			}
			return fmt.Errorf("%s: %d problems", args[0], len(errs))
		},
	}
	cmd.AddCommand(check)
	return cmd
}

// checkServerOptions finds every problem runServer would stop on before
// serving, without opening, binding or connecting anything, in the order
// the flags are documented.
func checkServerOptions(o serverOptions) []error {
	var p problems
	td := p.trustDomain(o.trustDomain)
	if _, err := ca.ParseKeyType(o.keyType); err != nil {
		p.add(fmt.Errorf("ca-key-type: %w", err))
	}
	p.add(o.jwt.check())
	p.add(o.keys.check(os.Getenv, o.caDir))
	p.add(checkStorageFlags(o))
	p.storage(o.kube)
	if _, err := newLogger(io.Discard, o.logFormat, o.logLevel); err != nil {
		p.add(err)
	}
	p.listeners(o)
	p.bundleProfile(o.bundle, td)
	p.grpcService(o.grpc, td)
	if !td.IsZero() {
		if _, _, _, err := staticEndpoints(o.federation, td, orRelayed(storedBundles(o), relayedTrustDomains(o.bundle))); err != nil {
			p.add(err)
		}
	}
	return p
}

// storedBundles is what config check knows of held bundles: the
// last-known-good files of --data-dir. With --storage kube they are in
// ConfigMaps, which config check does not connect to, so none are known
// and an https_spiffe endpoint without its bootstrap bundle is refused,
// which the server too would do on a cluster whose store is empty.
func storedBundles(o serverOptions) func(spiffeid.TrustDomain) bool {
	if o.kube.storage == storageKube {
		return nil
	}
	lkg := federation.NewLKGStore(o.dataDir)
	return func(td spiffeid.TrustDomain) bool { return federation.StoreHolds(lkg, td) }
}

// problems collects what checkServerOptions finds.
type problems []error

func (p *problems) add(err error) {
	if err != nil {
		*p = append(*p, err)
	}
}

// trustDomain checks --trust-domain; the zero value when it is missing or
// invalid, so that checks that need it are skipped.
func (p *problems) trustDomain(name string) spiffeid.TrustDomain {
	if name == "" {
		p.add(errors.New("trust-domain (or TRUST_DOMAIN) is required"))
		return spiffeid.TrustDomain{}
	}
	td, err := bundledoc.TrustDomainName(name)
	if err != nil {
		p.add(fmt.Errorf("trust-domain %q: %w", name, err))
		return spiffeid.TrustDomain{}
	}
	return td
}

func (p *problems) storage(k kubeOptions) {
	switch k.storage {
	case "", storageFile, storageKube:
	default:
		p.add(fmt.Errorf("storage %q: want file or kube", k.storage))
	}
	if k.namespaceSelector != "" {
		if _, err := labels.Parse(k.namespaceSelector); err != nil {
			p.add(fmt.Errorf("namespace-selector %q: %w", k.namespaceSelector, err))
		}
	}
}

// listeners checks the listen addresses and the admin API's host check.
func (p *problems) listeners(o serverOptions) {
	for _, l := range []struct{ flag, addr string }{
		{"admin-listen", o.adminListen}, {"bundle-listen", o.bundle.listen}, {"grpc-listen", o.grpc.listen},
	} {
		if l.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(l.addr); err != nil {
			p.add(fmt.Errorf("%s %q: %w", l.flag, l.addr, err))
		}
	}
	if _, _, err := net.SplitHostPort(o.adminListen); err == nil {
		if _, err := adminHostCheck(o.adminListen, o.adminHosts, nil); err != nil {
			p.add(err)
		}
	}
	p.add(checkListenerLimits(o))
}

// grpcService checks what setupGRPC refuses before listening: with the
// certificate service off, that no OIDC issuers or DNS name template are
// set (checkGRPCOff); on, its limits and grant flags, the workload DNS
// name template and the OIDC issuers (without fetching anything).
func (p *problems) grpcService(o grpcOptions, td spiffeid.TrustDomain) {
	if o.listen == "" {
		p.add(checkGRPCOff(o))
		return
	}
	p.add(checkGRPCFlags(o))
	if td.IsZero() {
		return
	}
	if _, err := workloadDNSNames(o, td); err != nil {
		p.add(err)
	}
	p.add(checkOIDCIssuers(o.oidc, td))
}

// bundleProfile checks the flags that only one --bundle-profile takes.
func (p *problems) bundleProfile(b bundleOptions, td spiffeid.TrustDomain) {
	switch b.profile {
	case profileSPIFFE:
		if b.tlsCert != "" || b.tlsKey != "" || len(b.acmeDomains) > 0 {
			p.add(errors.New("bundle-tls-cert, bundle-tls-key and acme-domain need bundle-profile https_web"))
		}
		if b.endpointID != "" && !td.IsZero() {
			p.add(checkEndpointID(b.endpointID, td))
		}
	case profileWeb:
		if b.endpointID != "" {
			p.add(errors.New("bundle-endpoint-spiffe-id needs bundle-profile https_spiffe"))
		}
		if len(b.acmeDomains) > 0 && (b.tlsCert != "" || b.tlsKey != "") {
			p.add(errors.New("use either acme-domain or bundle-tls-cert/bundle-tls-key, not both"))
		}
	default:
		p.add(fmt.Errorf("bundle-profile %q: want %s or %s", b.profile, profileSPIFFE, profileWeb))
	}
}

func checkEndpointID(s string, td spiffeid.TrustDomain) error {
	id, err := spiffeid.FromString(s)
	if err != nil {
		return fmt.Errorf("bundle-endpoint-spiffe-id %q: %w", s, err)
	}
	if !id.MemberOf(td) {
		return fmt.Errorf("bundle-endpoint-spiffe-id %q: our CA signs only %s identities", s, td.Name())
	}
	return nil
}
