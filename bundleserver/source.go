package bundleserver

import "github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

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
