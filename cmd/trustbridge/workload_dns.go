package main

import (
	"fmt"

	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/workloaddns"
)

// addWorkloadDNSFlags adds the template of the DNS names Kubernetes
// workloads' certificates carry beside their SPIFFE ID.
func addWorkloadDNSFlags(f *pflag.FlagSet, o *grpcOptions) {
	f.StringVar(&o.workloadDNSNameTemplate, "workload-dns-name-template", "",
		"DNS name put in the certificates of Kubernetes workloads beside their SPIFFE ID, for clients that check host names "+
			"(Open Service Mesh, plain TLS): {sa}, {ns} and {td} (the trust domain) each a whole label, "+
			"e.g. {sa}.{ns}.{td} (OSM's shape) or {sa}.{ns}.svc.cluster.local. Only for identities a Kubernetes service account "+
			"token proved (TokenReview or a kubernetes issuer), also when they renew with their certificate; never for bootstrap "+
			"or OIDC tokens, never a wildcard, never a --grpc-dns-names name. A namespace or service account that is not one DNS "+
			"label (a dot in the name) gets its certificate without one, logged. \"\" (default): none")
}

// workloadDNSNames parses --workload-dns-name-template; nil when unset.
// The certificate service's own names (--grpc-dns-names) are reserved:
// Istio agents check the CA's host name against the roots every workload
// certificate chains to.
func workloadDNSNames(o grpcOptions, td spiffeid.TrustDomain) (*workloaddns.Template, error) {
	if o.workloadDNSNameTemplate == "" {
		return nil, nil
	}
	t, err := workloaddns.Parse(o.workloadDNSNameTemplate, td, nonEmpty(o.dnsNames)...)
	if err != nil {
		return nil, fmt.Errorf("--workload-dns-name-template: %w", err)
	}
	return t, nil
}
