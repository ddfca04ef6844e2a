package server

import (
	"fmt"

	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/workloaddns"
)

// addWorkloadDNSFlags adds the template of the DNS names Kubernetes
// workloads' certificates carry beside their SPIFFE ID.
func addWorkloadDNSFlags(f *pflag.FlagSet, o *GRPCConfig) {
	f.StringVar(&o.WorkloadDNSNameTemplate, "workload-dns-name-template", "",
		"DNS name put in the certificates of Kubernetes workloads beside their SPIFFE ID, for clients that check host names "+
			"(Open Service Mesh, plain TLS): {sa}, {ns} and {td} (the trust domain) each a whole label, "+
			"e.g. {sa}.{ns}.{td} (OSM's shape) or {sa}.{ns}.svc.cluster.local. Only for identities a Kubernetes service account "+
			"token proved (TokenReview or a kubernetes issuer), also when they renew with their certificate; never for bootstrap "+
			"or OIDC tokens, never a wildcard, never a --grpc-dns-names name. A namespace or service account that is not one DNS "+
			"label (a dot in the name) gets its certificate without one, logged. Its zone (the part after {sa} and {ns}) is, with --downstream-dns-domain, the only DNS zone "+
			"an intermediate signed for a downstream (--downstream-allow) vouches for, and, under --upstream trustbridge, must lie in the upstream's. \"\" (default): none")
}

// workloadDNSNames parses --workload-dns-name-template; nil when unset.
// The certificate service's own names (--grpc-dns-names) are reserved:
// Istio agents check the CA's host name against the roots every workload
// certificate chains to.
func workloadDNSNames(o GRPCConfig, td spiffeid.TrustDomain) (*workloaddns.Template, error) {
	if o.WorkloadDNSNameTemplate == "" {
		return nil, nil
	}
	t, err := workloaddns.Parse(o.WorkloadDNSNameTemplate, td, nonEmpty(o.DNSNames)...)
	if err != nil {
		return nil, fmt.Errorf("--workload-dns-name-template: %w", err)
	}
	return t, nil
}

// workloadDNSZone is the zone of --workload-dns-name-template's names, ""
// without one or without the certificate service that issues them. As an
// upstream the CA lets downstream intermediates vouch for DNS names in it
// only; as a downstream it refuses an intermediate that does not permit
// them (ca.Config.WorkloadDNSZone).
func workloadDNSZone(o GRPCConfig, td spiffeid.TrustDomain) (string, error) {
	if o.Listen == "" {
		return "", nil // checkGRPCOff refuses a template
	}
	t, err := workloadDNSNames(o, td)
	if t == nil || err != nil {
		return "", err
	}
	return t.Zone(), nil
}

// servingDNSNames are the certificate service's serving certificate's DNS
// names (--grpc-dns-names), which an upstream's intermediate must permit
// (ca.Config.ServingDNSNames).
func servingDNSNames(o GRPCConfig) []string {
	if o.Listen == "" {
		return nil
	}
	return nonEmpty(o.DNSNames)
}
