// Package trustpolicy decides which federated trust domains each local
// workload may trust, and which peers of each it may accept: SPIRE's
// federatesWith, and OSM's allowed peer identities, for trustbridge.
//
// A Rule selects local workloads (a SPIFFE ID Pattern, a Kubernetes
// namespace, a label selector on the service account) and grants them
// federated trust domains, each optionally limited to peers matching
// Patterns. A trust domain named by any rule is governed: only the
// workloads some rule grants it to receive its roots. Trust domains no
// rule names follow the Default: DefaultAllow (every workload trusts them,
// trustbridge's behaviour without a policy) or DefaultDeny (nobody does).
// The local trust domain is always trusted. Rules only add; the union of
// the rules that select a workload is what it gets, and a grant without
// peers lifts another rule's peer limit for the same trust domain.
//
//	p, err := trustpolicy.Compile(local, trustpolicy.DefaultDeny, []trustpolicy.Rule{{
//		Name:         "payments-to-partner",
//		Workloads:    []trustpolicy.Selector{{SPIFFEID: "spiffe://example.org/ns/payments/*"}},
//		TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: "partner.example", Peers: []string{"spiffe://partner.example/ns/billing/sa/api"}}},
//	}})
//	d := p.Decide(trustpolicy.Subject{ID: id})
//	grant, ok := d.Allows(partnerTD) // ok, grant.Peers == [spiffe://partner.example/ns/billing/sa/api]
//
// Rules come from sources, each parsed by Parse or ParseNode (one YAML
// schema for the --trust-policy file, the trustPolicy section of --config
// and, rule by rule, the ClusterTrustPolicy resource): a Combiner merges
// every source's last good rules with the default and publishes the
// Policy in a Cell; a FileSource polls the file into it; Access reads the
// Cell (and service account labels) for every authenticated SDS caller and
// remembers which workloads each rule matched; Explain says why.
//
//	cell := trustpolicy.NewCell(nil)
//	comb, err := trustpolicy.NewCombiner(local, trustpolicy.DefaultAllow, cell, trustpolicy.WithRegisterer(reg))
//	file := trustpolicy.NewFileSource(path, comb, logger, 0)
//	err = file.Load() // then go file.Run(ctx)
//	access := trustpolicy.NewAccess(cell, labels)
//	d, changed := access.Decide(ident) // re-decide when changed closes
//
// Patterns are exact IDs or path prefixes ending in "/*", never regular
// expressions (Istio CVE-2026-39350): "spiffe://td/ns/pay/*" matches
// /ns/pay/sa/x but not /ns/payments/sa/x.
package trustpolicy
