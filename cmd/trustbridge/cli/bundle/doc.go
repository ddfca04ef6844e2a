// Package bundle is trustbridge bundle: inspect, which applies to a bundle
// document exactly the rules trustbridge applies to fetched bundles
// (internal/bundledoc) and exits 1 with the reason when it would be
// refused; show, the local trust domain's bundle from a data directory or a
// server; and set, a trust domain's bundle given to a running server.
package bundle
