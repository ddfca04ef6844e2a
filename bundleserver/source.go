package bundleserver

import (
	"slices"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

// Source provides the bundle the server publishes for one trust domain.
// ca.Authority and FileSource satisfy it.
type Source interface {
	// Bundle returns the current bundle, or nil while none is available.
	// The bundle is shared and must not be modified after it is returned:
	// the server keeps the pointer and re-renders only when it changes.
	Bundle() *spiffebundle.Bundle
}

// SourceFunc adapts a function to Source.
type SourceFunc func() *spiffebundle.Bundle

// Bundle calls f.
func (f SourceFunc) Bundle() *spiffebundle.Bundle { return f() }

// RevocationSource is what a Source may also implement to publish the
// authorities it revoked (issue 38): the served document then carries
// them in bundledoc.RevokedMember, and trustbridge peers refuse a later
// bundle that brings one back. FileSource implements it with what its
// file lists; ca.Authority is to implement it with what the CA revoked.
type RevocationSource interface {
	// Revocations returns the entries that go with the bundle Bundle
	// returns: none may name an authority that bundle carries (the
	// document would be refused, here and at peers). Publish a new bundle
	// before its entries, or both under one lock, and signal a change
	// after both: the server reads the bundle, the entries, then the
	// bundle again, and re-renders when either changed. The slice is
	// shared and must not be modified after it is returned.
	Revocations() []bundledoc.Revocation
}

// bundleOf reads src's bundle and, from a RevocationSource, its entries,
// again while the bundle changes under the read, so that the entries are
// never older than the bundle they are rendered with.
func bundleOf(src Source) (*spiffebundle.Bundle, []bundledoc.Revocation) {
	b := src.Bundle()
	rs, ok := src.(RevocationSource)
	if !ok {
		return b, nil
	}
	for range 3 {
		revs := rs.Revocations()
		again := src.Bundle()
		if again == b {
			return b, revs
		}
		b = again
	}
	// Still moving: whatever is read now is rendered, and the next change
	// signal renders the settled pair.
	return b, rs.Revocations()
}

// sameRevocations compares entry lists as a source returned them.
func sameRevocations(a, b []bundledoc.Revocation) bool {
	return slices.EqualFunc(a, b, func(x, y bundledoc.Revocation) bool {
		return x.Use == y.Use && x.X5TS256 == y.X5TS256 && x.KID == y.KID && x.NotAfter.Equal(y.NotAfter)
	})
}
