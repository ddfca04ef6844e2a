package server

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

// CheckConfig finds every problem runServer would stop on before
// serving, without opening, binding or connecting anything, in the order
// the flags are documented.
func CheckConfig(o Config) []error {
	var p problems
	td := p.trustDomain(o.TrustDomain)
	if _, err := ca.ParseKeyType(o.KeyType); err != nil {
		p.add(fmt.Errorf("ca-key-type: %w", err))
	}
	p.add(o.JWT.check())
	p.add(o.Keys.check(os.Getenv, o.CADir))
	p.add(checkStorageFlags(o))
	p.storage(o.Kube)
	if _, err := NewLogger(io.Discard, o.LogFormat, o.LogLevel); err != nil {
		p.add(err)
	}
	p.listeners(o)
	p.bundleProfile(o.Bundle, td)
	if !td.IsZero() {
		if err := checkIssuerCertificate(o.Bundle, o.JWT.Issuer, td); err != nil {
			p.add(err)
		}
	}
	p.grpcService(o.GRPC, td)
	if !td.IsZero() {
		if _, _, _, err := StaticEndpoints(o.Federation, td, OrRelayed(storedBundles(o), RelayedTrustDomains(o.Bundle))); err != nil {
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
func storedBundles(o Config) func(spiffeid.TrustDomain) bool {
	if o.Kube.Storage == StorageKube {
		return nil
	}
	lkg := federation.NewLKGStore(o.DataDir)
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

func (p *problems) storage(k KubeConfig) {
	switch k.Storage {
	case "", StorageFile, StorageKube:
	default:
		p.add(fmt.Errorf("storage %q: want file or kube", k.Storage))
	}
	if k.NamespaceSelector != "" {
		if _, err := labels.Parse(k.NamespaceSelector); err != nil {
			p.add(fmt.Errorf("namespace-selector %q: %w", k.NamespaceSelector, err))
		}
	}
}

// listeners checks the listen addresses and the admin API's host check.
func (p *problems) listeners(o Config) {
	for _, l := range []struct{ flag, addr string }{
		{"admin-listen", o.AdminListen}, {"bundle-listen", o.Bundle.Listen}, {"grpc-listen", o.GRPC.Listen},
	} {
		if l.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(l.addr); err != nil {
			p.add(fmt.Errorf("%s %q: %w", l.flag, l.addr, err))
		}
	}
	if _, _, err := net.SplitHostPort(o.AdminListen); err == nil {
		if _, err := adminHostCheck(o.AdminListen, o.AdminHosts, nil); err != nil {
			p.add(err)
		}
	}
	p.add(CheckListenerLimits(o))
}

// grpcService checks what setupGRPC refuses before listening: with the
// certificate service off, that no OIDC issuers or DNS name template are
// set (checkGRPCOff); on, its limits and grant flags, the workload DNS
// name template and the OIDC issuers (without fetching anything).
func (p *problems) grpcService(o GRPCConfig, td spiffeid.TrustDomain) {
	if o.Listen == "" {
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
	p.add(checkOIDCIssuers(o.OIDC, td))
}

// bundleProfile checks the flags that only one --bundle-profile takes.
func (p *problems) bundleProfile(b BundleConfig, td spiffeid.TrustDomain) {
	switch b.Profile {
	case ProfileSPIFFE:
		if b.TLSCert != "" || b.TLSKey != "" || len(b.ACMEDomains) > 0 {
			p.add(errors.New("bundle-tls-cert, bundle-tls-key and acme-domain need bundle-profile https_web"))
		}
		if b.EndpointID != "" && !td.IsZero() {
			p.add(checkEndpointID(b.EndpointID, td))
		}
	case ProfileWeb:
		if b.EndpointID != "" {
			p.add(errors.New("bundle-endpoint-spiffe-id needs bundle-profile https_spiffe"))
		}
		if len(b.ACMEDomains) > 0 && (b.TLSCert != "" || b.TLSKey != "") {
			p.add(errors.New("use either acme-domain or bundle-tls-cert/bundle-tls-key, not both"))
		}
	default:
		p.add(fmt.Errorf("bundle-profile %q: want %s or %s", b.Profile, ProfileSPIFFE, ProfileWeb))
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
