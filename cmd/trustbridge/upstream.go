package main

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
	upstreamTrustbridge = "trustbridge"
	upstreamKubeCSR     = "kube-csr"
)

// upstreamOptions are the upstream authority flags: the kind and the
// intermediate lifetime asked for. Each kind's client adds one field here
// for its own flags (trustbridge, kubeCSR).
type upstreamOptions struct {
	kind string
	ttl  time.Duration
	// trustbridge: --upstream trustbridge (upstream_trustbridge.go).
	trustbridge trustbridgeUpstreamOptions
	// kubeCSR: --upstream kube-csr (upstream_kubecsr.go).
	kubeCSR kubeCSROptions
	// kubeconfig is the server's --kubeconfig, which kube-csr talks to.
	kubeconfig string
}

func addUpstreamFlags(f *pflag.FlagSet, o *upstreamOptions) {
	f.StringVar(&o.kind, "upstream", upstreamNone, `run as an intermediate CA under an upstream authority: "trustbridge" (another trustbridge's certificate service) or "kube-csr" (the Kubernetes CSR API); empty is a self-signed CA`)
	f.DurationVar(&o.ttl, "upstream-ttl", ca.DefaultConfig().UpstreamTTL, "lifetime of the intermediate asked of the upstream; it is renewed at half its life")
	addTrustbridgeUpstreamFlags(f, &o.trustbridge)
	addKubeCSRFlags(f, &o.kubeCSR)
}

// check refuses upstream settings that cannot work together.
func (o upstreamOptions) check(caDir string) error {
	switch o.kind {
	case upstreamNone, upstreamTrustbridge, upstreamKubeCSR:
	default:
		return fmt.Errorf("--upstream %q: want %q or %q (or empty for a self-signed CA)", o.kind, upstreamTrustbridge, upstreamKubeCSR)
	}
	if o.kind == upstreamNone {
		return nil
	}
	if caDir != "" {
		return errors.New("--upstream and --ca-dir cannot be combined: the signing certificate comes either from an upstream authority or from the plug-in directory")
	}
	if o.ttl < 0 {
		return fmt.Errorf("--upstream-ttl %s must not be negative", o.ttl)
	}
	return nil
}

// newUpstream is the upstream authority --upstream names, nil for none.
func newUpstream(o upstreamOptions, td spiffeid.TrustDomain, logger *slog.Logger) (ca.UpstreamAuthority, error) {
	switch o.kind {
	case upstreamTrustbridge:
		return newTrustbridgeUpstream(o, logger)
	case upstreamKubeCSR:
		return newKubeCSRUpstream(o, td, logger)
	default:
		return nil, nil
	}
}

// newTrustbridgeUpstream is the client of another trustbridge's
// certificate service.
func newTrustbridgeUpstream(o upstreamOptions, _ *slog.Logger) (ca.UpstreamAuthority, error) {
	return newTrustbridgeUpstreamClient(o.trustbridge)
}

// newKubeCSRUpstream is the Kubernetes CSR API client.
func newKubeCSRUpstream(o upstreamOptions, td spiffeid.TrustDomain, logger *slog.Logger) (ca.UpstreamAuthority, error) {
	return newKubeCSRClient(o.kubeCSR, o.kubeconfig, td.Name(), logger)
}

// applyUpstream sets cfg's upstream from o.
func applyUpstream(o upstreamOptions, caDir string, cfg *ca.Config, logger *slog.Logger) error {
	if err := o.check(caDir); err != nil {
		return err
	}
	u, err := newUpstream(o, cfg.TrustDomain, logger)
	if err != nil {
		return err
	}
	if u != nil {
		cfg.Upstream, cfg.UpstreamTTL = u, o.ttl // 0: ca's default
	}
	return nil
}
