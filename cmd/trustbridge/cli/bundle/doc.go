// Package bundle is trustbridge bundle: inspect, which applies to a bundle
// document (or PEM roots) exactly the rules trustbridge applies to fetched
// bundles (internal/bundledoc) and exits 1 with the reason when it would be
// refused; show, the local trust domain's bundle from a data directory or a
// server; list, every bundle a running server holds; and set and delete, a
// trust domain's static bundle given to or taken from a running server.
package bundle
