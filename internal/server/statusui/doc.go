// Package statusui renders the read-only status page the admin listener
// serves at GET /ui: whom this server trusts, by which keys, since when and
// from where, for a security team that should not have to read JSON.
//
// The page is drawn on the server from one api.Snapshot with
// html/template: a header naming the local trust domain, the replica and
// the snapshot time; a summary; the findings with severity and fix; a
// table of every trust domain (state, origin, endpoint, profile,
// sequence, last success, next refresh, last error); a graph of who
// federates with whom and a timeline of every X.509 authority's validity
// with today marked, both inline SVG with a deterministic layout; the
// OIDC issuers served, with their keys and certificate coverage; and a
// table of every authority. It needs no JavaScript and loads nothing: the
// CSS is inline and the Content-Security-Policy forbids everything else.
// Every value from the snapshot is escaped by html/template, and CSS
// classes are chosen from fixed sets, never copied from data.
//
// Usage, next to /v1/snapshot on the admin mux:
//
//	mux.Handle("/ui", statusui.Handler(h.Snapshot, audit.Findings)) // internal/server/admin
//
// Mount it without a method in the pattern ("/ui", not "GET /ui"), so that
// it refuses other methods itself, with its security headers.
//
// Relative times ("in 3d", "5m ago") are measured from the snapshot's own
// Time, so a page is a pure function of its snapshot and findings.
package statusui
