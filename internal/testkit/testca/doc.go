// Package testca is a test helper. It mints SPIFFE CAs, X509-SVIDs and keys
// of every shape the parsers must handle, at run time, so tests never ship
// PEMs that expire. Production code must not import it.
//
//	ca := testca.New(t, "example.org")
//	leaf, key := ca.Issue(t, spiffeid.RequireFromString("spiffe://example.org/w"))
package testca
