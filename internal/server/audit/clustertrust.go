package audit

import (
	"fmt"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// CodeClusterTrustBundleSkipped: a trust domain the server holds has no
// ClusterTrustBundle (--cluster-trust-bundle-signer), so pods mounting it
// by label get none of its roots.
const CodeClusterTrustBundleSkipped = "cluster_trust_bundle_skipped"

// clusterTrustBundleFindings reports each trust domain the leader left
// without a ClusterTrustBundle, with what to do about its reason.
func clusterTrustBundleFindings(s api.Snapshot) []api.Finding {
	ctb := s.ClusterTrustBundles
	if ctb == nil {
		return nil
	}
	var out []api.Finding
	for _, sk := range ctb.Skipped {
		fix := "see the leader's log for the trust domain"
		switch sk.Reason {
		case "too_large":
			fix = "the bundle is over the API server's 1 MiB: ask the trust domain's operators to prune retired authorities"
		case "no_ca_authorities":
			fix = "its bundle holds no CA certificate (basic constraints, CA bit): ask its operators to publish its roots"
		case "name_collision":
			fix = "two trust domains map to one ClusterTrustBundle name: stop federating with the one you did not mean to"
		}
		out = append(out, api.Finding{Severity: api.SeverityWarning, Code: CodeClusterTrustBundleSkipped, TrustDomain: sk.TrustDomain,
			Message: fmt.Sprintf("%s has no ClusterTrustBundle of signer %s (%s): %s; pods mounting it by label get none of its roots",
				sk.TrustDomain, ctb.Signer, sk.Reason, sk.Message), Fix: fix})
	}
	return out
}
