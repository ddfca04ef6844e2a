package authn

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"fmt"
	"net/url"
	"path"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var (
	localTD     = spiffeid.RequireTrustDomainFromString("example.org")
	federatedTD = spiffeid.RequireTrustDomainFromString("other.org")
	workloadID  = spiffeid.RequireFromString("spiffe://example.org/ns/default/sa/web")
)

// withEKU is a template from c restricted to usages.
func withEKU(c *x509.Certificate, usages ...x509.ExtKeyUsage) *x509.Certificate {
	tmpl := *c
	tmpl.ExtKeyUsage = usages
	return &tmpl
}

// intermediate mints a CA signed by parent, for chains longer than a leaf.
func intermediate(t testing.TB, parent *testca.CA) *testca.CA {
	t.Helper()
	key := testca.NewKey(t, testca.ECP256)
	now := time.Now().Add(-time.Minute)
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(t),
		Subject:               pkix.Name{CommonName: "intermediate " + t.Name()},
		NotBefore:             now,
		NotAfter:              now.Add(12 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		URIs:                  []*url.URL{parent.TrustDomain.ID().URL()},
	}
	cert := testca.Sign(t, tmpl, parent.Cert, key.Public(), parent.Key)
	return &testca.CA{TrustDomain: parent.TrustDomain, Cert: cert, Key: key}
}

func TestX509SVID(t *testing.T) {
	local := testca.New(t, "example.org")
	federated := testca.New(t, "other.org")
	rogue := testca.New(t, "example.org") // same trust domain, not in our roots
	inter := intermediate(t, local)

	leaf, _ := local.Issue(t, workloadID)
	interLeaf, _ := inter.Issue(t, workloadID)
	fedLeaf, _ := federated.Issue(t, spiffeid.RequireFromString("spiffe://other.org/ns/default/sa/web"))
	fedSignedLocalID, _ := federated.Issue(t, workloadID)
	rogueLeaf, _ := rogue.Issue(t, workloadID)
	noURI, _ := local.Issue(t, workloadID, testca.Options{Mutate: func(c *x509.Certificate) {
		c.URIs = nil
		c.DNSNames = []string{"web.example.org"}
	}})
	twoURIs, _ := local.Issue(t, workloadID, testca.Options{Mutate: func(c *x509.Certificate) {
		c.URIs = append(c.URIs, spiffeid.RequireFromString("spiffe://example.org/other").URL())
	}})
	caLeaf, _ := local.Issue(t, workloadID, testca.Options{Mutate: func(c *x509.Certificate) {
		c.IsCA = true
		c.KeyUsage |= x509.KeyUsageCertSign
	}})
	serverOnly, _ := local.Issue(t, workloadID, testca.Options{Mutate: func(c *x509.Certificate) {
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}})
	noEKU, _ := local.Issue(t, workloadID, testca.Options{Mutate: func(c *x509.Certificate) {
		c.ExtKeyUsage = nil
	}})
	noPath, _ := local.Issue(t, workloadID, testca.Options{Mutate: func(c *x509.Certificate) {
		c.URIs = []*url.URL{localTD.ID().URL()}
	}})
	upperScheme, _ := local.Issue(t, workloadID, testca.Options{Mutate: func(c *x509.Certificate) {
		c.URIs = nil
		val, err := asn1.Marshal([]asn1.RawValue{{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte("SPIFFE://" + workloadID.String()[len("spiffe://"):])}})
		require.NoError(t, err)
		c.ExtraExtensions = append(c.ExtraExtensions, pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: val})
	}})
	serverInter := intermediate(t, local)
	serverInter.Cert = testca.Sign(t, withEKU(serverInter.Cert, x509.ExtKeyUsageServerAuth), local.Cert, serverInter.Key.Public(), local.Key)
	underServerInter, _ := serverInter.Issue(t, workloadID)
	now := time.Now()

	roots := x509bundle.NewSet(
		x509bundle.FromX509Authorities(localTD, []*x509.Certificate{local.Cert}),
		x509bundle.FromX509Authorities(federatedTD, []*x509.Certificate{federated.Cert}),
	)

	tests := []struct {
		name    string
		certs   []*x509.Certificate
		at      time.Time
		roots   x509bundle.Source
		want    spiffeid.ID
		wantErr error
		errHas  string
	}{
		{name: "valid SVID", certs: []*x509.Certificate{leaf}, want: workloadID},
		{name: "valid SVID with intermediate", certs: []*x509.Certificate{interLeaf, inter.Cert}, want: workloadID},
		{name: "no EKU is fine", certs: []*x509.Certificate{noEKU}, want: workloadID},
		{name: "no certificate", wantErr: ErrNoCredentials},
		{name: "federated trust domain SVID", certs: []*x509.Certificate{fedLeaf}, wantErr: ErrInvalidCredentials, errHas: "not in the local trust domain"},
		{name: "local ID signed by federated root", certs: []*x509.Certificate{fedSignedLocalID}, wantErr: ErrInvalidCredentials, errHas: "could not verify"},
		{name: "chain not to local roots", certs: []*x509.Certificate{rogueLeaf}, wantErr: ErrInvalidCredentials, errHas: "could not verify"},
		{name: "intermediate missing", certs: []*x509.Certificate{interLeaf}, wantErr: ErrInvalidCredentials, errHas: "could not verify"},
		{name: "expired", certs: []*x509.Certificate{leaf}, at: leaf.NotAfter.Add(time.Second), wantErr: ErrInvalidCredentials, errHas: "expired"},
		{name: "not yet valid", certs: []*x509.Certificate{leaf}, at: leaf.NotBefore.Add(-time.Second), wantErr: ErrInvalidCredentials},
		{name: "not an SVID: no URI SAN", certs: []*x509.Certificate{noURI}, wantErr: ErrInvalidCredentials, errHas: "not an X509-SVID"},
		{name: "not an SVID: two URI SANs", certs: []*x509.Certificate{twoURIs}, wantErr: ErrInvalidCredentials, errHas: "not an X509-SVID"},
		{name: "CA certificate as leaf", certs: []*x509.Certificate{caLeaf}, wantErr: ErrInvalidCredentials, errHas: "is a CA"},
		{name: "root itself has no path", certs: []*x509.Certificate{local.Cert}, wantErr: ErrInvalidCredentials, errHas: "no path"},
		{name: "leaf without a path", certs: []*x509.Certificate{noPath}, wantErr: ErrInvalidCredentials, errHas: "no path"},
		{name: "URI SAN the ID only once normalized", certs: []*x509.Certificate{upperScheme}, wantErr: ErrInvalidCredentials, errHas: "not a valid X509-SVID leaf"},
		{name: "intermediate for serverAuth only", certs: []*x509.Certificate{underServerInter, serverInter.Cert}, wantErr: ErrInvalidCredentials, errHas: "clientAuth"},
		{name: "serverAuth only", certs: []*x509.Certificate{serverOnly}, wantErr: ErrInvalidCredentials, errHas: "clientAuth"},
		{name: "too many certificates", certs: []*x509.Certificate{leaf, inter.Cert, inter.Cert, inter.Cert, inter.Cert, inter.Cert, inter.Cert, inter.Cert, inter.Cert}, wantErr: ErrInvalidCredentials, errHas: "more than"},
		{name: "nil certificate", certs: []*x509.Certificate{leaf, nil}, wantErr: ErrInvalidCredentials},
		{name: "no local bundle", certs: []*x509.Certificate{leaf}, roots: x509bundle.NewSet(x509bundle.FromX509Authorities(federatedTD, []*x509.Certificate{federated.Cert, local.Cert})), wantErr: ErrInvalidCredentials, errHas: "local roots"},
		{name: "empty local bundle", certs: []*x509.Certificate{leaf}, roots: x509bundle.New(localTD), wantErr: ErrInvalidCredentials, errHas: "no X.509 roots"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at := tt.at
			if at.IsZero() {
				at = now
			}
			src := tt.roots
			if src == nil {
				src = roots
			}
			a := NewX509SVID(localTD, src, clocktesting.NewFakePassiveClock(at))
			id, err := a.Authenticate(context.Background(), Request{PeerCertificates: tt.certs})
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				assert.Contains(t, err.Error(), "authn: x509-svid: ")
				assert.Contains(t, err.Error(), tt.errHas)
				assert.Zero(t, id)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, Identity{ID: tt.want, Method: MethodX509SVID}, idOnly(id))
		})
	}
}

// TestX509SVIDRootsRotated shows the roots are asked on every call: after a
// rotation that drops the old root, its SVIDs stop authenticating, and
// SVIDs of the new root start.
func TestX509SVIDRootsRotated(t *testing.T) {
	oldRoot := testca.New(t, "example.org")
	newRoot := testca.New(t, "example.org")
	oldLeaf, _ := oldRoot.Issue(t, workloadID)
	newLeaf, _ := newRoot.Issue(t, workloadID)

	roots := x509bundle.NewSet(x509bundle.FromX509Authorities(localTD, []*x509.Certificate{oldRoot.Cert}))
	a := NewX509SVID(localTD, roots, nil)
	ctx := context.Background()

	_, err := a.Authenticate(ctx, Request{PeerCertificates: []*x509.Certificate{oldLeaf}})
	require.NoError(t, err)
	_, err = a.Authenticate(ctx, Request{PeerCertificates: []*x509.Certificate{newLeaf}})
	require.ErrorIs(t, err, ErrInvalidCredentials, "new root not yet published")

	// Both published during the overlap.
	roots.Add(x509bundle.FromX509Authorities(localTD, []*x509.Certificate{oldRoot.Cert, newRoot.Cert}))
	for _, leaf := range []*x509.Certificate{oldLeaf, newLeaf} {
		_, err = a.Authenticate(ctx, Request{PeerCertificates: []*x509.Certificate{leaf}})
		require.NoError(t, err)
	}

	// Old root removed.
	roots.Add(x509bundle.FromX509Authorities(localTD, []*x509.Certificate{newRoot.Cert}))
	_, err = a.Authenticate(ctx, Request{PeerCertificates: []*x509.Certificate{oldLeaf}})
	require.ErrorIs(t, err, ErrInvalidCredentials)
	id, err := a.Authenticate(ctx, Request{PeerCertificates: []*x509.Certificate{newLeaf}})
	require.NoError(t, err)
	assert.Equal(t, workloadID, id.ID)
}

func TestX509SVIDNoTrustDomain(t *testing.T) {
	local := testca.New(t, "example.org")
	leaf, _ := local.Issue(t, workloadID)
	for name, a := range map[string]*X509SVID{
		"zero trust domain": NewX509SVID(spiffeid.TrustDomain{}, local.Bundle(), nil),
		"nil roots":         NewX509SVID(localTD, nil, nil),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := a.Authenticate(context.Background(), Request{PeerCertificates: []*x509.Certificate{leaf}})
			require.ErrorIs(t, err, ErrInvalidCredentials)
		})
	}
}

// countVerify makes a count the chain verifications it does, which is how
// the tests tell a cache hit from a miss.
func countVerify(a *X509SVID) *atomic.Int64 {
	var n atomic.Int64
	next := a.verify
	a.verify = func(certs []*x509.Certificate, src x509bundle.Source, usage x509.ExtKeyUsage, opts ...x509svid.VerifyOption) (spiffeid.ID, [][]*x509.Certificate, error) {
		n.Add(1)
		return next(certs, src, usage, opts...)
	}
	return &n
}

// TestX509SVIDVerifyCache shows which calls a verified chain serves again
// and which go through verification: steps run in order on one
// authenticator, each saying whether it verified and what it returned.
func TestX509SVIDVerifyCache(t *testing.T) {
	local := testca.New(t, "example.org")
	inter := intermediate(t, local)
	leaf, _ := local.Issue(t, workloadID)
	interLeaf, _ := inter.Issue(t, workloadID)
	otherID := spiffeid.RequireFromString("spiffe://example.org/ns/default/sa/db")
	otherLeaf, _ := local.Issue(t, otherID)

	type step struct {
		name       string
		certs      []*x509.Certificate
		before     func(set *x509bundle.Set) // changes the roots first
		wantVerify bool
		wantErr    string // empty: authenticates as workloadID
		want       spiffeid.ID
	}
	steps := []step{
		{name: "first call verifies", certs: []*x509.Certificate{leaf}, wantVerify: true},
		{name: "same chain again hits", certs: []*x509.Certificate{leaf}},
		{name: "chain with intermediate verifies", certs: []*x509.Certificate{interLeaf, inter.Cert}, wantVerify: true},
		{name: "chain with intermediate hits", certs: []*x509.Certificate{interLeaf, inter.Cert}},
		{name: "same leaf without the intermediate does not hit", certs: []*x509.Certificate{interLeaf}, wantVerify: true, wantErr: "could not verify"},
		{name: "and its failure is cached", certs: []*x509.Certificate{interLeaf}, wantErr: "could not verify"},
		{name: "same leaf with an extra certificate does not hit", certs: []*x509.Certificate{interLeaf, inter.Cert, local.Cert}, wantVerify: true},
		{name: "another leaf verifies", certs: []*x509.Certificate{otherLeaf}, wantVerify: true, want: otherID},
		{name: "another leaf hits as itself", certs: []*x509.Certificate{otherLeaf}, want: otherID},
		{name: "same roots in a new bundle miss", certs: []*x509.Certificate{leaf}, wantVerify: true, before: func(set *x509bundle.Set) {
			set.Add(x509bundle.FromX509Authorities(localTD, []*x509.Certificate{local.Cert}))
		}},
		{name: "then hit against the new bundle", certs: []*x509.Certificate{leaf}},
		{name: "a failure against a new bundle is verified again", certs: []*x509.Certificate{interLeaf}, wantVerify: true, wantErr: "could not verify", before: func(set *x509bundle.Set) {
			set.Add(x509bundle.FromX509Authorities(localTD, []*x509.Certificate{local.Cert}))
		}},
	}

	set := x509bundle.NewSet(x509bundle.FromX509Authorities(localTD, []*x509.Certificate{local.Cert}))
	a := NewX509SVID(localTD, set, nil)
	verified := countVerify(a)
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			if s.before != nil {
				s.before(set)
			}
			before := verified.Load()
			id, err := a.Authenticate(context.Background(), Request{PeerCertificates: s.certs})
			assert.Equal(t, s.wantVerify, verified.Load() > before, "verified")
			if s.wantErr != "" {
				require.ErrorIs(t, err, ErrInvalidCredentials)
				assert.Contains(t, err.Error(), s.wantErr)
				assert.Zero(t, id)
				return
			}
			require.NoError(t, err)
			want := s.want
			if want.IsZero() {
				want = workloadID
			}
			assert.Equal(t, want, id.ID)
			assert.Equal(t, MethodX509SVID, id.Method)
		})
	}
}

// TestX509SVIDVerifyCacheRootRemoved shows a cached chain stops
// authenticating as soon as its root leaves the bundle: through a new
// bundle, as sources are meant to publish, and through a bundle changed in
// place, which the contract rules out but which must still fail closed.
func TestX509SVIDVerifyCacheRootRemoved(t *testing.T) {
	tests := []struct {
		name   string
		rotate func(set *x509bundle.Set, b *x509bundle.Bundle, oldRoot, newRoot *x509.Certificate)
	}{
		{name: "new bundle without the root", rotate: func(set *x509bundle.Set, _ *x509bundle.Bundle, _, newRoot *x509.Certificate) {
			set.Add(x509bundle.FromX509Authorities(localTD, []*x509.Certificate{newRoot}))
		}},
		{name: "root removed in place", rotate: func(_ *x509bundle.Set, b *x509bundle.Bundle, oldRoot, newRoot *x509.Certificate) {
			b.AddX509Authority(newRoot)
			b.RemoveX509Authority(oldRoot)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			oldRoot := testca.New(t, "example.org")
			newRoot := testca.New(t, "example.org")
			oldLeaf, _ := oldRoot.Issue(t, workloadID)
			newLeaf, _ := newRoot.Issue(t, workloadID)
			b := x509bundle.FromX509Authorities(localTD, []*x509.Certificate{oldRoot.Cert})
			set := x509bundle.NewSet(b)
			a := NewX509SVID(localTD, set, nil)
			ctx := context.Background()

			for range 2 { // verified, then cached
				_, err := a.Authenticate(ctx, Request{PeerCertificates: []*x509.Certificate{oldLeaf}})
				require.NoError(t, err)
			}
			require.Equal(t, 1, a.cache.len())

			tt.rotate(set, b, oldRoot.Cert, newRoot.Cert)
			_, err := a.Authenticate(ctx, Request{PeerCertificates: []*x509.Certificate{oldLeaf}})
			require.ErrorIs(t, err, ErrInvalidCredentials)
			assert.Contains(t, err.Error(), "could not verify")
			id, err := a.Authenticate(ctx, Request{PeerCertificates: []*x509.Certificate{newLeaf}})
			require.NoError(t, err)
			assert.Equal(t, workloadID, id.ID)
		})
	}
}

// TestX509SVIDVerifyCacheExpiry shows a cached chain is good until the
// earliest NotAfter in it, here the intermediate's, checked against the
// clock on every hit, and not before the latest NotBefore.
func TestX509SVIDVerifyCacheExpiry(t *testing.T) {
	local := testca.New(t, "example.org")
	inter := intermediate(t, local)
	// The leaf outlives its intermediate, so the intermediate bounds the chain.
	leaf, _ := inter.Issue(t, workloadID, testca.Options{Mutate: func(c *x509.Certificate) {
		c.NotBefore = inter.Cert.NotBefore.Add(time.Minute)
		c.NotAfter = inter.Cert.NotAfter.Add(6 * time.Hour)
	}})
	certs := []*x509.Certificate{leaf, inter.Cert}
	start := leaf.NotBefore.Add(time.Hour)

	tests := []struct {
		name       string
		at         time.Time
		wantVerify bool
		wantErr    string
	}{
		{name: "within validity hits", at: start},
		{name: "at the intermediate's NotAfter still hits", at: inter.Cert.NotAfter},
		{name: "past the intermediate's NotAfter verifies and fails", at: inter.Cert.NotAfter.Add(time.Second), wantVerify: true, wantErr: "expired"},
		{name: "back within validity verifies again", at: start, wantVerify: true},
		{name: "and hits", at: start.Add(time.Hour)},
		{name: "before the leaf's NotBefore verifies and fails", at: leaf.NotBefore.Add(-time.Second), wantVerify: true, wantErr: "could not verify"},
	}

	clk := clocktesting.NewFakePassiveClock(start)
	a := NewX509SVID(localTD, local.Bundle().X509Bundle(), clk)
	verified := countVerify(a)
	_, err := a.Authenticate(context.Background(), Request{PeerCertificates: certs})
	require.NoError(t, err)
	require.EqualValues(t, 1, verified.Load())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk.SetTime(tt.at)
			before := verified.Load()
			id, err := a.Authenticate(context.Background(), Request{PeerCertificates: certs})
			assert.Equal(t, tt.wantVerify, verified.Load() > before, "verified")
			if tt.wantErr != "" {
				require.ErrorIs(t, err, ErrInvalidCredentials)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, workloadID, id.ID)
		})
	}
}

// TestX509SVIDVerifyCacheBound shows the cache holds at most its size,
// evicting the least recently used chain, and that size 0 turns it off.
func TestX509SVIDVerifyCacheBound(t *testing.T) {
	local := testca.New(t, "example.org")
	var leaves []*x509.Certificate
	for i := range 3 {
		l, _ := local.Issue(t, spiffeid.RequireFromSegments(localTD, "bound", fmt.Sprint(i)))
		leaves = append(leaves, l)
	}
	roots := local.Bundle().X509Bundle()

	tests := []struct {
		name      string
		size      int
		calls     []int // indexes into leaves
		wantCalls int   // verifications
		wantLen   int
	}{
		{name: "hits while under the bound", size: 2, calls: []int{0, 1, 0, 1}, wantCalls: 2, wantLen: 2},
		{name: "third chain evicts the least recently used", size: 2, calls: []int{0, 1, 0, 2, 0, 1}, wantCalls: 4, wantLen: 2},
		{name: "size one", size: 1, calls: []int{0, 0, 1, 0}, wantCalls: 3, wantLen: 1},
		{name: "size zero turns the cache off", size: 0, calls: []int{0, 0, 0}, wantCalls: 3, wantLen: 0},
		{name: "negative size turns the cache off", size: -1, calls: []int{0, 0}, wantCalls: 2, wantLen: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewX509SVID(localTD, roots, nil, WithVerifyCacheSize(tt.size))
			verified := countVerify(a)
			for _, i := range tt.calls {
				id, err := a.Authenticate(context.Background(), Request{PeerCertificates: []*x509.Certificate{leaves[i]}})
				require.NoError(t, err)
				assert.Equal(t, fmt.Sprint(i), path.Base(id.ID.Path()))
			}
			assert.EqualValues(t, tt.wantCalls, verified.Load())
			assert.Equal(t, tt.wantLen, a.cache.len())
		})
	}
	assert.Equal(t, DefaultVerifyCacheSize, NewX509SVID(localTD, roots, nil).cache.max)
}

// TestX509SVIDVerifyCacheConcurrent runs many callers over more chains
// than the cache holds while the roots are republished, for -race: every
// call must authenticate as its own identity.
func TestX509SVIDVerifyCacheConcurrent(t *testing.T) {
	local := testca.New(t, "example.org")
	var leaves []*x509.Certificate
	for i := range 6 {
		l, _ := local.Issue(t, spiffeid.RequireFromSegments(localTD, "c", fmt.Sprint(i)))
		leaves = append(leaves, l)
	}
	set := x509bundle.NewSet(x509bundle.FromX509Authorities(localTD, []*x509.Certificate{local.Cert}))
	// Every caller shares one (empty) address: room for all of them, this
	// test is about the cache.
	a := NewX509SVID(localTD, set, nil, WithVerifyCacheSize(4), WithMaxVerifications(16, 16))

	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Go(func() {
			for i := range 50 {
				leaf := leaves[(g+i)%len(leaves)]
				if g == 0 && i%10 == 0 {
					set.Add(x509bundle.FromX509Authorities(localTD, []*x509.Certificate{local.Cert}))
				}
				id, err := a.Authenticate(context.Background(), Request{PeerCertificates: []*x509.Certificate{leaf}})
				if err == nil && id.ID.String() != leaf.URIs[0].String() {
					err = fmt.Errorf("authenticated %s as %s", leaf.URIs[0], id.ID)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	assert.LessOrEqual(t, a.cache.len(), 4)
}

func TestChainDigest(t *testing.T) {
	local := testca.New(t, "example.org")
	inter := intermediate(t, local)
	leaf, _ := inter.Issue(t, workloadID)
	// The same bytes split differently must not collide.
	a := &x509.Certificate{Raw: []byte("ab")}
	b := &x509.Certificate{Raw: []byte("c")}
	c := &x509.Certificate{Raw: []byte("a")}
	d := &x509.Certificate{Raw: []byte("bc")}

	tests := []struct {
		name string
		x, y []*x509.Certificate
		same bool
	}{
		{name: "same chain", x: []*x509.Certificate{leaf, inter.Cert}, y: []*x509.Certificate{leaf, inter.Cert}, same: true},
		{name: "intermediate dropped", x: []*x509.Certificate{leaf, inter.Cert}, y: []*x509.Certificate{leaf}},
		{name: "order swapped", x: []*x509.Certificate{leaf, inter.Cert}, y: []*x509.Certificate{inter.Cert, leaf}},
		{name: "extra certificate", x: []*x509.Certificate{leaf, inter.Cert}, y: []*x509.Certificate{leaf, inter.Cert, local.Cert}},
		{name: "boundaries moved", x: []*x509.Certificate{a, b}, y: []*x509.Certificate{c, d}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.same, chainDigest(tt.x) == chainDigest(tt.y))
		})
	}
}
