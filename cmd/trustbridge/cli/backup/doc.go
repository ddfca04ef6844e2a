// Package backup is trustbridge backup and restore: an archive of a data
// directory (CA state, federated bundles, audit log) taken while the server
// runs, and put back into a data directory no server holds.
package backup
