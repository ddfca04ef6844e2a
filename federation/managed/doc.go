// Package managed is the federation an operator changes while the server
// runs: relationships added, updated and removed with `trustbridge
// federation add|update|remove`, and static bundles (`trustbridge bundle
// set|delete`) of trust domains without an endpoint. A Manager checks each change with the rules
// every other way of configuring federation obeys
// (federation.CheckFirstFetch, the endpoint parsers, the bundle checks),
// refuses trust domains configured elsewhere (flags, files, resources),
// applies the change and persists it; a change that cannot be applied or
// persisted leaves the last good state.
//
//	m, err := managed.New(managed.Config{
//		Dir: dataDir, Local: td, Reserved: where, Others: staticEndpoints,
//		Held: poller.Holds, Apply: apply, Probe: probe, OnChange: audit,
//	})
//	err = m.Add(ctx, ep, managed.AddOptions{Actor: "admin-token"})
//
// The endpoints persist in Dir/EndpointsFile, in the --federation-config
// schema with each bootstrap bundle inline (trustDomainBundle), so an
// operator can read it and move it into the configuration; the static
// bundles in Dir/BundlesFile as a SPIFFE bundle map (SPIFFE Trust Domain
// and Bundle §5.1.1).
package managed
