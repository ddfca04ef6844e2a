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
	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

func newConfigCmd(e env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with trustbridge server's --config file",
	}
	check := &cobra.Command{
		Use:   "check FILE",
		Short: "Validate a server config file without starting anything",
		Long: `Read FILE as trustbridge server --config would, with the environment
variables that apply (TRUST_DOMAIN, SPIFFE_BUNDLE_ENDPOINTS, POD_NAMESPACE), and
check everything that can be checked without starting: unknown or repeated keys,
every value's type, the trust domain, the CA key type, the storage and flag
combinations, listen addresses, log settings and every federation endpoint
(including bootstrap bundles). Prints "ok" or every problem found; the exit
status is 1 on any problem.`,
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
// serving, without opening, binding or connecting anything.
func checkServerOptions(o serverOptions) []error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var td spiffeid.TrustDomain
	if o.trustDomain == "" {
		add(errors.New("trust-domain (or TRUST_DOMAIN) is required"))
	} else if t, err := bundledoc.TrustDomainName(o.trustDomain); err != nil {
		add(fmt.Errorf("trust-domain %q: %w", o.trustDomain, err))
	} else {
		td = t
	}
	if _, err := ca.ParseKeyType(o.keyType); err != nil {
		add(fmt.Errorf("ca-key-type: %w", err))
	}
	add(checkStorageFlags(o))
	switch o.kube.storage {
	case "", storageFile, storageKube:
	default:
		add(fmt.Errorf("storage %q: want file or kube", o.kube.storage))
	}
	if o.kube.namespaceSelector != "" {
		if _, err := labels.Parse(o.kube.namespaceSelector); err != nil {
			add(fmt.Errorf("namespace-selector %q: %w", o.kube.namespaceSelector, err))
		}
	}
	if _, err := newLogger(io.Discard, o.logFormat, o.logLevel); err != nil {
		add(err)
	}
	for _, l := range []struct{ flag, addr string }{
		{"admin-listen", o.adminListen}, {"bundle-listen", o.bundle.listen}, {"grpc-listen", o.grpc.listen},
	} {
		if l.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(l.addr); err != nil {
			add(fmt.Errorf("%s %q: %w", l.flag, l.addr, err))
		}
	}
	if _, _, err := net.SplitHostPort(o.adminListen); err == nil {
		if _, err := adminHostCheck(o.adminListen, o.adminHosts, nil); err != nil {
			add(err)
		}
	}
	switch o.bundle.profile {
	case profileSPIFFE:
		if o.bundle.tlsCert != "" || o.bundle.tlsKey != "" || len(o.bundle.acmeDomains) > 0 {
			add(errors.New("bundle-tls-cert, bundle-tls-key and acme-domain need bundle-profile https_web"))
		}
		if o.bundle.endpointID != "" && !td.IsZero() {
			if id, err := spiffeid.FromString(o.bundle.endpointID); err != nil {
				add(fmt.Errorf("bundle-endpoint-spiffe-id %q: %w", o.bundle.endpointID, err))
			} else if !id.MemberOf(td) {
				add(fmt.Errorf("bundle-endpoint-spiffe-id %q: our CA signs only %s identities", o.bundle.endpointID, td.Name()))
			}
		}
	case profileWeb:
		if o.bundle.endpointID != "" {
			add(errors.New("bundle-endpoint-spiffe-id needs bundle-profile https_spiffe"))
		}
		if len(o.bundle.acmeDomains) > 0 && (o.bundle.tlsCert != "" || o.bundle.tlsKey != "") {
			add(errors.New("use either acme-domain or bundle-tls-cert/bundle-tls-key, not both"))
		}
	default:
		add(fmt.Errorf("bundle-profile %q: want %s or %s", o.bundle.profile, profileSPIFFE, profileWeb))
	}
	if !td.IsZero() {
		if _, _, _, err := staticEndpoints(o.federation, td); err != nil {
			add(err)
		}
	}
	return errs
}
