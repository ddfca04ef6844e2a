package server

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/kubernetes"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/server/nodeauth"
)

// addImpersonationFlags adds the flag naming the node proxies allowed to
// ask for the certificates of the pods on their node.
func addImpersonationFlags(f *pflag.FlagSet, o *GRPCConfig) {
	f.StringSliceVar(&o.TrustedNodeAccounts, "ca-trusted-node-accounts", []string{nodeauth.DefaultTrustedNodeAccount},
		"service accounts (namespace/name, comma-separated) of node proxies, Istio's ztunnel by default, that may ask for the "+
			"certificate of a pod on their own node with Istio's ImpersonatedIdentity, as istiod's CA_TRUSTED_NODE_ACCOUNTS: the caller "+
			"must authenticate with a token bound to its pod, and a pod of the impersonated service account must run on that pod's "+
			"node (read from the Kubernetes API: needs get, list and watch on pods). Needs Kubernetes (--token-review); \"\" refuses "+
			"all impersonation. E.g. istio-system/ztunnel,kube-system/node-proxy")
}

// addListedAgentFlags adds the flag listing node agents outside
// Kubernetes and the identities each may act for.
func addListedAgentFlags(f *pflag.FlagSet, o *GRPCConfig) {
	f.StringArrayVar(&o.NodeAgents, "ca-node-agent", nil,
		"a node agent outside Kubernetes (a VM's trustbridge agent --node) and the only identities it may ask for on behalf of its workloads, "+
			"with Istio's ImpersonatedIdentity: AGENT_SPIFFE_ID=ID[,ID...], each ID exact or a prefix ending /*, all of this trust domain "+
			"(repeatable, one per agent). The agent must authenticate with a token (a reusable bootstrap token, or an OIDC issuer's), "+
			"so that no certificate it gets for a workload can renew itself; a listed agent is decided by its list alone. "+
			"E.g. spiffe://example.org/vm/web-1=spiffe://example.org/vm/web-1/nginx,spiffe://example.org/vm/web-1/jobs/*")
}

// addListedAgents lets the node agents of --ca-node-agent act for the
// identities listed for them, beside the Kubernetes node authorizer if
// any.
func (g *grpcEndpoint) addListedAgents(o GRPCConfig, td spiffeid.TrustDomain, logger *slog.Logger) error {
	if len(o.NodeAgents) == 0 {
		return nil
	}
	// The certificate service's own ID is never a workload's.
	l, err := nodeauth.ParseListed(td, o.NodeAgents, g.id)
	if err != nil {
		return fmt.Errorf("--ca-node-agent %w", err)
	}
	g.impersonator = nodeauth.Either(l, g.impersonator)
	logger.Info("node agents outside Kubernetes may ask for the identities listed for them (ImpersonatedIdentity)",
		"node_agents", strings.Join(l.Agents(), ","))
	return nil
}

// addImpersonation builds the node authorizer for the certificate service
// when node accounts are configured, and runs its pod informer with the
// server.
func (g *grpcEndpoint) addImpersonation(client kubernetes.Interface, o GRPCConfig, td spiffeid.TrustDomain, logger *slog.Logger) error {
	accounts := nonEmpty(o.TrustedNodeAccounts)
	if len(accounts) == 0 {
		return nil
	}
	a, err := nodeauth.New(nodeauth.Config{Client: client, TrustDomain: td, TrustedNodeAccounts: accounts,
		IdentityMap: o.identityMap, MapReady: o.identityMapReady, Logger: logger.With(logattr.Component, "node-authorizer")})
	if err != nil {
		return fmt.Errorf("--ca-trusted-node-accounts: %w", err)
	}
	g.impersonator = a
	g.runners = append(g.runners, a.Run)
	logger.Info("node proxies may ask for the certificates of the pods on their node (ImpersonatedIdentity)",
		"trusted_node_accounts", strings.Join(accounts, ","), "identity_map", o.identityMap != nil)
	return nil
}

// nonEmpty drops blank entries of a list flag.
func nonEmpty(list []string) []string {
	var out []string
	for _, s := range list {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
