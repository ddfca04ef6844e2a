// Package federation is trustbridge federation: status, show and refresh
// of a server's federated trust domains, and the relationships changed at
// run time (list, add, update, remove) through its admin API.
package federation
