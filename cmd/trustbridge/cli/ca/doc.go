// Package ca is trustbridge ca: issue (a workload certificate from a data
// directory's CA state, offline), rotate (prepare a successor root or JWT
// key now), raise-sequence (move the published spiffe_sequence past a
// peer's), request (a certificate from a running server's certificate
// service, by bootstrap token, renewal or provisioning certificate) and
// authority (list, prepare, activate, taint and revoke a running server's
// signing authorities through its admin API: incident response) and drill
// (that whole sequence against a running server, timed, waiting for the
// re-issue and for the peers' fetch of the revocation).
package ca
