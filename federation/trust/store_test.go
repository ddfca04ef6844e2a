package trust_test

import (
	"crypto"
	"crypto/x509"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var (
	_ x509bundle.Source   = (*trust.Store)(nil)
	_ jwtbundle.Source    = (*trust.Store)(nil)
	_ spiffebundle.Source = (*trust.Store)(nil)
	_ x509bundle.Source   = (*trust.Snapshot)(nil)
	// What a federation fetcher asks of its bundle source.
	_ interface {
		X509BundleFor(spiffeid.TrustDomain) (*x509bundle.Bundle, bool)
	} = (*trust.Store)(nil)
)

func TestStoreUnionOfSources(t *testing.T) {
	own, fed, file := testca.New(t, "a.test"), testca.New(t, "a.test"), testca.New(t, "a.test")
	s := trust.NewStore()
	s.Set("ca", own.Bundle())
	s.Set("federation:https://a.test/bundle", fed.Bundle())
	fileBundle := file.Bundle()
	fileBundle.AddX509Authority(own.Cert) // duplicates collapse
	s.Set("file:/etc/a.json", fileBundle)

	b, ok := s.Bundle(tdA)
	require.True(t, ok)
	assert.ElementsMatch(t, []*x509.Certificate{own.Cert, fed.Cert, file.Cert}, b.X509Authorities())
	assert.Equal(t, []string{"ca", "federation:https://a.test/bundle", "file:/etc/a.json"}, s.Sources(tdA))
	xb, ok := s.X509BundleFor(tdA)
	require.True(t, ok)
	assert.Len(t, xb.X509Authorities(), 3)

	s.Remove("federation:https://a.test/bundle", tdA)
	b, _ = s.Bundle(tdA)
	assert.ElementsMatch(t, []*x509.Certificate{own.Cert, file.Cert}, b.X509Authorities())

	s.Remove("ca", tdA)
	s.Remove("file:/etc/a.json", tdA)
	_, ok = s.Bundle(tdA)
	assert.False(t, ok, "a trust domain without sources is gone")
	assert.Empty(t, s.TrustDomains())
	_, err := s.GetX509BundleForTrustDomain(tdA)
	assert.Error(t, err)
}

func TestStoreKeysByBundleTrustDomain(t *testing.T) {
	caA, caB := testca.New(t, "a.test"), testca.New(t, "b.test")
	s := storeWith(caA)
	// A source named after a.test hands in b.test's bundle: it lands under
	// b.test and never touches a.test's roots.
	s.Set("federation:a.test", caB.Bundle())
	a, _ := s.Bundle(tdA)
	assert.Equal(t, []*x509.Certificate{caA.Cert}, a.X509Authorities())
	b, ok := s.Bundle(tdB)
	require.True(t, ok)
	assert.Equal(t, []*x509.Certificate{caB.Cert}, b.X509Authorities())
	assert.Equal(t, []spiffeid.TrustDomain{tdA, tdB}, s.TrustDomains())

	// Removing a source under one trust domain leaves the other alone.
	s.Remove("federation:a.test", tdA)
	_, ok = s.Bundle(tdB)
	assert.True(t, ok)
	s.Remove("federation:a.test", tdB)
	_, ok = s.Bundle(tdB)
	assert.False(t, ok)
	_, ok = s.Bundle(tdA)
	assert.True(t, ok)
}

func TestStoreJWTKeysAndHints(t *testing.T) {
	k1 := testca.NewKey(t, testca.ECP256).Public()
	k2 := testca.NewKey(t, testca.ECP256).Public()
	k3 := testca.NewKey(t, testca.ECP256).Public()
	first := spiffebundle.FromJWTAuthorities(tdA, map[string]crypto.PublicKey{"shared": k1, "one": k2})
	first.SetRefreshHint(5 * time.Minute)
	first.SetSequenceNumber(7)
	second := spiffebundle.FromJWTAuthorities(tdA, map[string]crypto.PublicKey{"shared": k3})
	second.SetRefreshHint(time.Minute)

	s := trust.NewStore()
	s.Set("b-source", second) // update order must not matter
	s.Set("a-source", first)
	b, _ := s.Bundle(tdA)
	got, ok := b.FindJWTAuthority("shared")
	require.True(t, ok)
	assert.Equal(t, k1, got, "on a key ID clash the first source by name wins")
	assert.True(t, b.HasJWTAuthority("one"))
	hint, ok := b.RefreshHint()
	assert.True(t, ok)
	assert.Equal(t, time.Minute, hint, "shortest hint")
	_, ok = b.SequenceNumber()
	assert.False(t, ok, "a union has no sequence number")
	jb, err := s.GetJWTBundleForTrustDomain(tdA)
	require.NoError(t, err)
	assert.Len(t, jb.JWTAuthorities(), 2)
}

func TestStoreSnapshotsAreImmutable(t *testing.T) {
	ca1, ca2 := testca.New(t, "a.test"), testca.New(t, "a.test")
	s := trust.NewStore()
	in := ca1.Bundle()
	s.Set("ca", in)
	before := s.Snapshot()
	in.AddX509Authority(ca2.Cert) // the caller's copy, not the store's
	b, _ := before.Bundle(tdA)
	assert.Len(t, b.X509Authorities(), 1)

	s.Set("fed", ca2.Bundle())
	after := s.Snapshot()
	b, _ = before.Bundle(tdA)
	assert.Len(t, b.X509Authorities(), 1, "an old snapshot does not see later updates")
	b, _ = after.Bundle(tdA)
	assert.Len(t, b.X509Authorities(), 2)
	assert.Equal(t, before.Generation()+1, after.Generation())

	// A leaf of ca2 verifies against the new snapshot only.
	leaf, _ := ca2.Issue(t, idA)
	_, err := (&trust.Verifier{Bundles: before, Authorizer: tlsconfig.AuthorizeAny()}).VerifyPeer(raw(leaf))
	assert.ErrorIs(t, err, trust.ErrChain)
	_, err = (&trust.Verifier{Bundles: after, Authorizer: tlsconfig.AuthorizeAny()}).VerifyPeer(raw(leaf))
	assert.NoError(t, err)
}

func TestStoreSubscribe(t *testing.T) {
	caA, caB := testca.New(t, "a.test"), testca.New(t, "b.test")
	s := trust.NewStore()
	ch, cancel := s.Subscribe()
	ch2, cancel2 := s.Subscribe()
	defer cancel2()

	s.Set("ca", caA.Bundle())
	assert.Len(t, ch, 1, "one notification per change")
	<-ch

	s.Set("ca", caA.Bundle())
	assert.Len(t, ch, 0, "an identical Set is no change")
	s.Remove("nobody", tdA)
	assert.Len(t, ch, 0, "removing what is not there is no change")

	bumped := caA.Bundle()
	bumped.SetSequenceNumber(2)
	s.Set("ca", bumped)
	s.Set("mirror", caA.Bundle())
	assert.Len(t, ch, 0, "source changes that leave the effective bundle as it was")
	gen := s.Snapshot().Generation()

	s.Set("ca", caB.Bundle())
	s.Remove("ca", tdB)
	assert.Len(t, ch, 1, "undrained notifications coalesce")
	assert.Equal(t, gen+2, s.Snapshot().Generation())
	<-ch

	cancel()
	cancel()
	_, open := <-ch
	assert.False(t, open, "cancel closes the channel")
	s.Set("ca", caB.Bundle())
	assert.Len(t, ch2, 1, "other subscribers keep receiving")
}

// Writers and readers race on purpose; -race checks that readers never see
// a half-built snapshot.
func TestStoreConcurrentSetAndVerify(t *testing.T) {
	caA := testca.New(t, "a.test")
	others := make([]*testca.CA, 4)
	for i := range others {
		others[i] = testca.New(t, "b.test")
	}
	s := storeWith(caA)
	v := &trust.Verifier{Bundles: s, Authorizer: tlsconfig.AuthorizeAny()}
	leaf, _ := caA.Issue(t, idA)
	chain := raw(leaf)
	ch, cancel := s.Subscribe()
	defer cancel()

	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := v.VerifyPeer(chain); err != nil {
					t.Errorf("verify during updates: %v", err)
					return
				}
				s.Snapshot().TrustDomains()
			}
		})
	}
	wg.Go(func() {
		for range ch {
		}
	})
	for i := range 200 {
		ca := others[i%len(others)]
		s.Set("fed", ca.Bundle())
		s.Set("ca-rotating", testca.New(t, "a.test").Bundle())
		if i%3 == 0 {
			s.Remove("fed", tdB)
		}
	}
	close(stop)
	cancel()
	wg.Wait()
	b, _ := s.Bundle(tdA)
	assert.Len(t, b.X509Authorities(), 2)
}

// go-spiffe's own verifier, fed by the store, agrees with ours.
func TestStoreAsGoSpiffeSource(t *testing.T) {
	caA, caB := testca.New(t, "a.test"), testca.New(t, "b.test")
	s := storeWith(caA, caB)
	leaf, _ := caA.Issue(t, idA)
	id, _, err := x509svid.ParseAndVerify(raw(leaf), s)
	require.NoError(t, err)
	assert.Equal(t, idA, id)
	forged, _ := caB.Issue(t, idA)
	_, _, err = x509svid.ParseAndVerify(raw(forged), s)
	assert.Error(t, err)
}

func TestStoreSetPanicsOnNil(t *testing.T) {
	assert.Panics(t, func() { trust.NewStore().Set("x", nil) })
}

// A reader holding a snapshot learns from it that a newer one exists; the
// X.509 bundles are every trust domain's with roots, in name order.
func TestSnapshotSupersededAndX509Bundles(t *testing.T) {
	s := trust.NewStore()
	first := s.Snapshot()
	assert.Empty(t, first.X509Bundles())
	b := testca.New(t, "b.example")
	a := testca.New(t, "a.example")
	s.Set("peer", b.Bundle())
	select {
	case <-first.Superseded():
	default:
		t.Fatal("the first snapshot is not superseded after a change")
	}
	second := s.Snapshot()
	s.Set("peer", b.Bundle()) // the same keys: nothing published
	select {
	case <-second.Superseded():
		t.Fatal("a change that changes nothing supersedes nothing")
	default:
	}
	s.Set("other", a.Bundle())
	s.Set("jwt-only", spiffebundle.New(spiffeid.RequireTrustDomainFromString("c.example")))
	var names []string
	for _, x := range s.Snapshot().X509Bundles() {
		names = append(names, x.TrustDomain().Name())
	}
	assert.Equal(t, []string{"a.example", "b.example"}, names, "sorted, and without trust domains that have no X.509 roots")
}

// Published holds each source's bundle as the source set it, sequence
// included, and its subscribers wake for changes the union does not show;
// Subscribe's do not. An earlier Published never changes.
func TestStorePublished(t *testing.T) {
	a, b := testca.New(t, "a.test"), testca.New(t, "b.test")
	s := trust.NewStore()
	union, cancelUnion := s.Subscribe()
	defer cancelUnion()
	every, cancelEvery := s.SubscribePublished()
	defer cancelEvery()
	fed := func(td spiffeid.TrustDomain) string { return "federation:" + td.Name() }

	first := a.Bundle()
	first.SetSequenceNumber(7)
	s.Set(fed(tdA), first)
	s.Set("ca", a.Bundle()) // the same keys under another source
	s.Set(fed(tdB), b.Bundle())
	<-union
	<-every
	before := s.Published()
	got := before.BundlesOf(fed)
	require.Len(t, got, 2)
	assert.Equal(t, []spiffeid.TrustDomain{tdA, tdB}, []spiffeid.TrustDomain{got[0].TrustDomain(), got[1].TrustDomain()}, "in trust domain name order")
	assert.True(t, first.Equal(got[0]), "as the source set it, sequence included")
	assert.NotSame(t, first, got[0], "a copy: the caller may go on changing its own")
	assert.Equal(t, []string{"ca", "federation:a.test"}, s.Sources(tdA))

	// A new sequence on the same keys: the union is as it was.
	union0 := s.Snapshot()
	bumped := a.Bundle()
	bumped.SetSequenceNumber(8)
	s.Set(fed(tdA), bumped)
	assert.Len(t, union, 0, "the union did not change: Subscribe's subscribers sleep")
	assert.Len(t, every, 1, "a source's bundle did: SubscribePublished's wake")
	<-every
	assert.Same(t, union0, s.Snapshot(), "no snapshot published")
	now, ok := s.Published().Bundle(tdA, fed(tdA))
	require.True(t, ok)
	seq, _ := now.SequenceNumber()
	assert.Equal(t, uint64(8), seq)
	old, _ := before.Bundle(tdA, fed(tdA))
	seq, _ = old.SequenceNumber()
	assert.Equal(t, uint64(7), seq, "an earlier Published never changes")

	s.Remove(fed(tdB), tdB)
	<-union
	<-every
	assert.Len(t, s.Published().BundlesOf(fed), 1)
	_, ok = s.Published().Bundle(tdB, fed(tdB))
	assert.False(t, ok, "removed")
	assert.Len(t, before.BundlesOf(fed), 2, "an earlier Published never changes")
	assert.Empty(t, (&trust.Published{}).BundlesOf(fed), "the zero value is empty")
}
