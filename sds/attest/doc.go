// Package attest identifies the process at the other end of a unix
// socket, for the node agent's SDS and Workload API servers.
package attest
