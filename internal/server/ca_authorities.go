package server

import (
	"bytes"
	"crypto/x509"
	"slices"
	"sync"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

// caBundleSource is the CA as the bundle endpoint's local source: its bundle
// and, as a bundleserver.RevocationSource, the authorities an operator
// revoked (`ca authority revoke`), which the served document names so
// that trustbridge peers refuse a bundle that brings one back.
type caBundleSource struct{ a *ca.Authority }

func (s caBundleSource) Bundle() *spiffebundle.Bundle { return s.a.Bundle() }

func (s caBundleSource) Revocations() []bundledoc.Revocation { return caRevocations(s.a) }

// caRevocations are the entries of a's revoked roots, intermediates and
// JWT keys; the CA keeps them until they expire.
func caRevocations(a *ca.Authority) []bundledoc.Revocation {
	var out []bundledoc.Revocation
	for _, r := range a.Roots() {
		if r.State == castate.StateRevoked {
			out = append(out, bundledoc.RevokeX509(r.Cert))
		}
	}
	for _, k := range a.JWTKeys() {
		if k.State == castate.StateRevoked {
			out = append(out, bundledoc.Revocation{Use: bundledoc.UseJWTSVID, KID: k.KID, NotAfter: k.NotAfter})
		}
	}
	return out
}

// caTaints is the CA's tainted authorities as WatchBundles sends them
// (certservice.TaintSource): followCA refreshes it on every CA change,
// and each change closes the channel its readers hold.
type caTaints struct {
	mu        sync.Mutex
	current   []certservice.Tainted
	changed   chan struct{}
	followers []func([]certservice.Tainted)
}

// follow has f called with the tainted authorities on every change (and
// now, when some are); a nil t does nothing.
func (t *caTaints) follow(f func([]certservice.Tainted)) {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.followers = append(t.followers, f)
	current := t.current
	t.mu.Unlock()
	if len(current) > 0 {
		f(current)
	}
}

// signedByTainted says whether a leaf was signed by one of taints' X.509
// authorities: its AuthorityKeyId is one's SubjectKeyId.
func signedByTainted(taints []certservice.Tainted) func(*x509.Certificate) bool {
	return func(leaf *x509.Certificate) bool {
		for _, t := range taints {
			if len(t.X509SubjectKeyID) > 0 && bytes.Equal(t.X509SubjectKeyID, leaf.AuthorityKeyId) {
				return true
			}
		}
		return false
	}
}

func newCATaints() *caTaints { return &caTaints{changed: make(chan struct{})} }

// Tainted implements certservice.TaintSource.
func (t *caTaints) Tainted() ([]certservice.Tainted, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.current, t.changed
}

// update reads a's tainted authorities and wakes the readers when they
// changed. A tainted root or intermediate is named by its SubjectKeyId
// (what a leaf's AuthorityKeyId matches) and its fingerprint; a JWT key
// by its kid. Revoked ones are gone: nothing they signed verifies.
func (t *caTaints) update(a *ca.Authority) {
	var next []certservice.Tainted
	for _, r := range a.Roots() {
		if !r.TaintedAt.IsZero() && r.State != castate.StateRevoked {
			next = append(next, certservice.Tainted{X509SubjectKeyID: r.Cert.SubjectKeyId, X509SHA256: r.CertSHA256, At: r.TaintedAt})
		}
	}
	for _, k := range a.JWTKeys() {
		if !k.TaintedAt.IsZero() && k.State != castate.StateRevoked {
			next = append(next, certservice.Tainted{JWTKeyID: k.KID, At: k.TaintedAt})
		}
	}
	t.mu.Lock()
	if slices.EqualFunc(t.current, next, sameTaint) {
		t.mu.Unlock()
		return
	}
	t.current = next
	close(t.changed)
	t.changed = make(chan struct{})
	followers := t.followers
	t.mu.Unlock()
	for _, f := range followers {
		f(next)
	}
}

func sameTaint(a, b certservice.Tainted) bool {
	return bytes.Equal(a.X509SubjectKeyID, b.X509SubjectKeyID) && a.X509SHA256 == b.X509SHA256 && a.JWTKeyID == b.JWTKeyID && a.At.Equal(b.At)
}

// source is t as a certservice.TaintSource; nil for a nil t (tests that
// build the certificate service without a server).
func (t *caTaints) source() certservice.TaintSource {
	if t == nil {
		return nil
	}
	return t
}
