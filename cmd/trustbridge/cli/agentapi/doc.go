// Package agentapi is trustbridge agent api: fetch X509-SVIDs, JWT-SVIDs
// and bundles from a SPIFFE Workload API socket, and validate a JWT-SVID
// there, as a workload does (spire-agent api fetch and api validate). It
// is a Workload API client, go-spiffe's, and works against any agent
// that serves the API: trustbridge agent's --workload-api-socket, SPIRE's
// agent, spiffe-helper's peers.
//
// See the SPIFFE Workload API standard, sections 5 (X.509) and 6 (JWT).
package agentapi
