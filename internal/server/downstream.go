package server

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca/certservice"
)

// DownstreamConfig are the upstream side of nested trust: which
// downstream trustbridges may have their intermediate signed here
// (SignIntermediate), and for how long at most.
type DownstreamConfig struct {
	Allow      []string
	maxTTL     time.Duration
	DNSDomains []string
}

func addDownstreamFlags(f *pflag.FlagSet, o *DownstreamConfig) {
	f.StringArrayVar(&o.Allow, "downstream-allow", nil, "SPIFFE ID of a downstream trustbridge of this trust domain allowed to have its intermediate CA signed here (repeatable; exact IDs); "+
		"it must authenticate with an X509-SVID for that ID. Empty: no intermediates are signed. Roots made while it is set leave room for one intermediate level (rotate an older root once). See docs/upstream-trustbridge.md")
	f.DurationVar(&o.maxTTL, "max-downstream-ttl", certservice.DefaultMaxDownstreamTTL, "longest lifetime of an intermediate signed for a downstream; it renews at half life")
	f.StringArrayVar(&o.DNSDomains, "downstream-dns-domain", nil, "DNS domain a downstream's intermediate may vouch for, the domain and every name below it (repeatable), beside the zone of --workload-dns-name-template; "+
		"e.g. --downstream-dns-domain trustbridge.svc.cluster.local for downstream servers whose --grpc-dns-names lie there. Without either, an intermediate signed here vouches for no DNS name (and never an IP address)")
}

// parse returns the allow-list, every ID in td. A zero maxTTL is the
// service's default.
func (o DownstreamConfig) parse(td spiffeid.TrustDomain) ([]spiffeid.ID, error) {
	if o.maxTTL < 0 {
		return nil, fmt.Errorf("--max-downstream-ttl %s must not be negative", o.maxTTL)
	}
	ids := make([]spiffeid.ID, 0, len(o.Allow))
	for _, s := range o.Allow {
		id, err := spiffeid.FromString(s)
		if err != nil {
			return nil, fmt.Errorf("--downstream-allow %q: %w", s, err)
		}
		if id.TrustDomain() != td {
			return nil, fmt.Errorf("--downstream-allow %s is not in trust domain %s: an intermediate is only signed for this trust domain's servers", id, td)
		}
		ids = append(ids, id)
	}
	return ids, nil
}
