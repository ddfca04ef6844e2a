// Package signbench measures signing at the limit (issue 40): X509-SVIDs
// and JWT-SVIDs minted over the wire by trustbridge and by SPIRE server
// 1.13.3 (bin/spire from make spire-tools), side by side, at 1, 8 and 64
// concurrent clients, and a burst of 10,000 first certificates within one
// second. Each server runs in a process of its own, so its CPU time per
// certificate and its peak memory are read from /proc for that process
// alone; the clients run in the benchmark's process, the same client code
// against both servers, each client on a TLS connection of its own.
//
// Beside them, in the same rounds, runs the transport floor: a gRPC
// server with the certificate service's options and TLS whose handlers do
// no work, this test binary again in a process of its own
// (TestFloorServerProcess). Its CPU per call is what gRPC, HTTP/2, TLS
// and the Go runtime cost, so trustbridge's CPU per certificate splits
// into that floor, the signing (measured in process) and the service's
// own work. The signing floor is the same server doing the in-process
// signing on each call and nothing else: the least any server signing
// with this code costs here, which a goal for trustbridge's CPU per
// operation must be read against. And trustbridge-batched is trustbridge
// with its clients minting JWT-SVIDs as the node agent does, through one
// connection and caclient.JWTBatcher.
//
// The package holds only benchmarks and what they share; make bench runs
// them with TRUSTBRIDGE_BIN and TRUSTBRIDGE_SPIRE_TESTS=require.
package signbench
