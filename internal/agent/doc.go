// Package agent is trustbridge agent as a package: the node agent of
// sds/agent (SDS and the SPIFFE Workload API for one workload, its
// certificate from a trustbridge server or from files) composed with what
// the process adds beside it: logs, metrics, the admin listener and SIGHUP.
//
//	a := agent.New(agent.Config{Socket: "./sds.sock", CAAddr: "ca.example.org:15012", ...})
//	return a.Run(ctx)
package agent
