package authn

import (
	"context"
	"crypto/x509"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// issuerSet is a server's own signing certificates as WithOwnIssuers asks
// for them; set changes them, as a rotation does.
type issuerSet struct {
	mu    sync.Mutex
	certs []*x509.Certificate
}

func (s *issuerSet) set(certs ...*x509.Certificate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.certs = certs
}

func (s *issuerSet) own(issuer *x509.Certificate) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.certs {
		if c.Equal(issuer) {
			return true
		}
	}
	return false
}

// saGrantedLeaf is a leaf of workloadID that ca signed with a service
// account grant: a real one when ca is ours, a forged one otherwise.
func saGrantedLeaf(t *testing.T, ca *testca.CA) *x509.Certificate {
	t.Helper()
	ext, err := Grant{Method: MethodKubernetesJWT, Ref: "payments/api", UID: "uid-1", GrantedAt: time.Now()}.Extension()
	require.NoError(t, err)
	return grantedLeaf(t, ca, ext)
}

// TestX509SVIDOwnIssuers: with WithOwnIssuers, a leaf's grant record is
// read only when the leaf's issuer is the server's own; any other leaf
// that verifies still authenticates, with a GrantErr naming its issuer
// that GrantPolicy refuses as unreadable. Without the option every
// verified leaf's grant is read.
func TestX509SVIDOwnIssuers(t *testing.T) {
	root := testca.New(t, "example.org")
	inter := intermediate(t, root) // a downstream's, or ours under an upstream
	rootLeaf := saGrantedLeaf(t, root)
	interLeaf := saGrantedLeaf(t, inter)
	bundle := x509bundle.FromX509Authorities(localTD, []*x509.Certificate{root.Cert})

	for _, tc := range []struct {
		name       string
		own        []*x509.Certificate // nil: the option is unset
		certs      []*x509.Certificate
		wantIssuer string // empty: the grant is read
	}{
		{name: "self-signed: a leaf of our root", own: []*x509.Certificate{root.Cert}, certs: []*x509.Certificate{rootLeaf}},
		{name: "self-signed: a leaf of a downstream intermediate", own: []*x509.Certificate{root.Cert},
			certs: []*x509.Certificate{interLeaf, inter.Cert}, wantIssuer: inter.Cert.Subject.String()},
		{name: "upstream: a leaf of our intermediate", own: []*x509.Certificate{inter.Cert}, certs: []*x509.Certificate{interLeaf, inter.Cert}},
		{name: "upstream: a leaf of the upstream itself", own: []*x509.Certificate{inter.Cert},
			certs: []*x509.Certificate{rootLeaf}, wantIssuer: root.Cert.Subject.String()},
		{name: "no own issuers: a leaf of a downstream intermediate", certs: []*x509.Certificate{interLeaf, inter.Cert}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []X509SVIDOption
			if tc.own != nil {
				s := &issuerSet{}
				s.set(tc.own...)
				opts = append(opts, WithOwnIssuers(s.own))
			}
			a := NewX509SVID(localTD, bundle, nil, opts...)
			ident, err := a.Authenticate(context.Background(), Request{PeerCertificates: tc.certs})
			require.NoError(t, err, "the chain verifies, so the caller authenticates")
			assert.Equal(t, workloadID, ident.ID)
			assert.Equal(t, MethodX509SVID, ident.Method)
			_, checkErr := (&GrantPolicy{Checkers: map[string]GrantChecker{MethodKubernetesJWT: GrantCheckerFunc(
				func(context.Context, spiffeid.ID, Grant) error { return nil })}}).Check(context.Background(), ident)
			if tc.wantIssuer == "" {
				require.NoError(t, ident.GrantErr)
				require.NotNil(t, ident.Grant)
				assert.Equal(t, "payments/api", ident.Grant.Ref)
				assert.NoError(t, checkErr)
				return
			}
			assert.Nil(t, ident.Grant, "a grant another CA wrote is never reported")
			require.ErrorIs(t, ident.GrantErr, ErrNotIssuedHere)
			assert.Contains(t, ident.GrantErr.Error(), `issued by "`+tc.wantIssuer+`"`)
			assert.Contains(t, ident.GrantErr.Error(), "renew at the CA that issued it")
			assert.ErrorIs(t, checkErr, ErrGrantUnreadable)
			assert.ErrorIs(t, checkErr, ErrNotIssuedHere)
		})
	}
}

// TestX509SVIDOwnIssuersCached: a cached verification still asks whether
// the issuer is the server's own, on every call, so a change of the
// server's signing certificates (which leaves the bundle alone in
// upstream mode) takes effect at once, both ways, without verifying the
// chain again.
func TestX509SVIDOwnIssuersCached(t *testing.T) {
	root := testca.New(t, "example.org")
	inter := intermediate(t, root)
	leaf := saGrantedLeaf(t, inter)
	s := &issuerSet{}
	s.set(inter.Cert)
	a := NewX509SVID(localTD, x509bundle.FromX509Authorities(localTD, []*x509.Certificate{root.Cert}), nil, WithOwnIssuers(s.own))
	verified := countVerify(a)

	for i, step := range []struct {
		own       []*x509.Certificate
		wantGrant bool
	}{
		{own: []*x509.Certificate{inter.Cert}, wantGrant: true},
		{own: []*x509.Certificate{root.Cert}},
		{own: []*x509.Certificate{root.Cert, inter.Cert}, wantGrant: true},
		{},
	} {
		s.set(step.own...)
		ident, err := a.Authenticate(context.Background(), Request{PeerCertificates: []*x509.Certificate{leaf, inter.Cert}})
		require.NoError(t, err, "step %d", i)
		if step.wantGrant {
			assert.NoError(t, ident.GrantErr, "step %d", i)
			assert.NotNil(t, ident.Grant, "step %d", i)
		} else {
			assert.ErrorIs(t, ident.GrantErr, ErrNotIssuedHere, "step %d", i)
			assert.Nil(t, ident.Grant, "step %d", i)
		}
	}
	assert.Equal(t, int64(1), verified.Load(), "verified once, then served from the cache")
}
