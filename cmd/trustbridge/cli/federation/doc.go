// Package federation is trustbridge federation: status and refresh of a
// server's federated trust domains, and the relationships changed at run
// time (list, add, remove) through its admin API.
package federation
