// Package spiretest runs a real SPIRE server and agent (v1.13.3, built by
// `make spire-tools` from the module pinned in internal/testkit/spiretest/tools
// into bin/spire) on loopback, for tests of trustbridge as a federation
// peer of SPIRE, and of trustbridge's node agent against SPIRE's.
//
// A federation peer: spire-server federating with trustbridge.
//
//	s := spiretest.Start(t, spiretest.Config{TrustDomain: "spire.example", Federates: []spiretest.Federation{{
//		TrustDomain: "east.example", URL: "https://127.0.0.1:8443/", EndpointSPIFFEID: "spiffe://east.example/trustbridge/bundle-endpoint",
//	}}})
//	s.SetBundle(t, "east.example", bootstrapDoc) // https_spiffe needs the peer's bundle once
//	b, err := s.Refresh("east.example")         // federation refresh, then bundle list
//
// A reference node agent: spire-agent attested to that server by a join
// token, attesting its callers with the unix workload attestor and serving
// them SDS on its Workload API socket, with Istio's resource names:
// `default` (the caller's X509-SVID) and `ROOTCA` (Envoy's SPIFFE validator
// holding the local trust domain and every one the caller's entry
// federates with).
//
//	s.SetBundle(t, "peer.example", peerDoc)     // SPIRE must hold a bundle to federate with
//	a := s.StartAgent(t, spiretest.AgentConfig{})
//	e := a.RegisterUID(t, "spiffe://spire.example/workload", os.Getuid(), "peer.example")
//	a.WaitSynced(t, e)                           // the agent serves e to this process
//	spire := spiretest.EnvoySecrets(t, a.SDS(t), spiretest.DefaultSVIDName, spiretest.RootCAName)
//	ours := spiretest.EnvoySecrets(t, spiretest.SDSClient(t, ourSocket), spiretest.DefaultSVIDName, spiretest.RootCAName)
//	// compare ours[name].Secrets with spire[name].Secrets field by field
//
// A signing peer (issue 40's benchmarks, internal/testkit/signbench): a
// client that attests as an agent itself with JoinToken over Addr (Agent
// API, mTLS afterwards) and asks for SVIDs of entries parented to it;
// Config.NoSigningRateLimit turns off SPIRE's per-IP signing limit, PID
// is the process to read CPU time from.
//
// EnvoySecrets and DecodeSDS reduce any SDS server's answer to plain
// values (resource names and kinds, the leaf's URI SANs, the validator's
// name and type, each trust domain with the SHA-256s of its roots), with
// the resources as served beside them, so that two servers can be diffed.
//
// SPIRE 1.13.3 serves `ROOTCA` with every federated bundle only when it is
// default_all_bundles_name and default_bundle_name is something else:
// when the two are equal, it warns that default_all_bundles_name is
// ignored and serves the local trust domain alone. AgentConfig's defaults
// are therefore Istio's: default_bundle_name "null",
// default_all_bundles_name "ROOTCA".
//
// What SPIRE needs: the binaries (without them the tests skip, unless
// TRUSTBRIDGE_SPIRE_TESTS=require, set by `make test`, which makes a missing
// binary a failure; TRUSTBRIDGE_SPIRE_SERVER and TRUSTBRIDGE_SPIRE_AGENT
// point at others), a writable temporary directory with a short path (the
// sockets' paths must fit in sun_path), and loopback TCP. The kit is run as
// root (as make test runs here; other users untried); the agent attests the
// test process by its uid (SO_PEERCRED, then /proc/<pid>), so register the
// entry for os.Getuid().
// The server keeps its state (SQLite datastore, in-memory keys) and the
// agent its data dir in temporary directories; both are stopped at the end
// of the test (agent first), their logs printed if it failed. A new entry
// reaches an agent within a couple of seconds: the server reloads its
// entry cache and the agent syncs every second.
package spiretest
