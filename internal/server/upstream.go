package server

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca"
)

// Upstream kinds (--upstream).
const (
	upstreamNone        = ""
	UpstreamTrustbridge = "trustbridge"
	upstreamKubeCSR     = "kube-csr"
)

// UpstreamConfig are the upstream authority flags: the kind and the
// intermediate lifetime asked for. Each kind's client adds one field here
// for its own flags (trustbridge, kubeCSR).
type UpstreamConfig struct {
	Kind string
	TTL  time.Duration
	// Trustbridge: --upstream trustbridge (upstream_trustbridge.go).
	Trustbridge TrustbridgeUpstreamConfig
	// kubeCSR: --upstream kube-csr (upstream_kubecsr.go).
	kubeCSR kubeCSROptions
	// kubeconfig is the server's --kubeconfig, which kube-csr talks to.
	kubeconfig string
}

func addUpstreamFlags(f *pflag.FlagSet, o *UpstreamConfig) {
	f.StringVar(&o.Kind, "upstream", upstreamNone, `run as an intermediate CA under an upstream authority: "trustbridge" (another trustbridge's certificate service) or "kube-csr" (the Kubernetes CSR API); empty is a self-signed CA`)
	f.DurationVar(&o.TTL, "upstream-ttl", ca.DefaultConfig().UpstreamTTL, "lifetime of the intermediate asked of the upstream; it is renewed at half its life")
	addTrustbridgeUpstreamFlags(f, &o.Trustbridge)
	addKubeCSRFlags(f, &o.kubeCSR)
}

// check refuses upstream settings that cannot work together.
func (o UpstreamConfig) check(caDir string) error {
	switch o.Kind {
	case upstreamNone, UpstreamTrustbridge, upstreamKubeCSR:
	default:
		return fmt.Errorf("--upstream %q: want %q or %q (or empty for a self-signed CA)", o.Kind, UpstreamTrustbridge, upstreamKubeCSR)
	}
	if o.Kind == upstreamNone {
		return nil
	}
	if caDir != "" {
		return errors.New("--upstream and --ca-dir cannot be combined: the signing certificate comes either from an upstream authority or from the plug-in directory")
	}
	if o.TTL < 0 {
		return fmt.Errorf("--upstream-ttl %s must not be negative", o.TTL)
	}
	return nil
}

// newUpstream is the upstream authority --upstream names, nil for none.
func newUpstream(o UpstreamConfig, td spiffeid.TrustDomain, logger *slog.Logger) (ca.UpstreamAuthority, error) {
	switch o.Kind {
	case UpstreamTrustbridge:
		return newTrustbridgeUpstream(o, logger)
	case upstreamKubeCSR:
		return newKubeCSRUpstream(o, td, logger)
	default:
		return nil, nil
	}
}

// newTrustbridgeUpstream is the client of another trustbridge's
// certificate service.
func newTrustbridgeUpstream(o UpstreamConfig, _ *slog.Logger) (ca.UpstreamAuthority, error) {
	return newTrustbridgeUpstreamClient(o.Trustbridge)
}

// newKubeCSRUpstream is the Kubernetes CSR API client.
func newKubeCSRUpstream(o UpstreamConfig, td spiffeid.TrustDomain, logger *slog.Logger) (ca.UpstreamAuthority, error) {
	return newKubeCSRClient(o.kubeCSR, o.kubeconfig, td.Name(), logger)
}

// applyUpstream sets cfg's upstream from o.
func applyUpstream(o UpstreamConfig, caDir string, cfg *ca.Config, logger *slog.Logger) error {
	if err := o.check(caDir); err != nil {
		return err
	}
	u, err := newUpstream(o, cfg.TrustDomain, logger)
	if err != nil {
		return err
	}
	if u != nil {
		cfg.Upstream, cfg.UpstreamTTL = u, o.TTL // 0: ca's default
	}
	return nil
}
