package workload

import (
	"context"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func TestCellSetRefuses(t *testing.T) {
	w := newWorld(t)
	good := w.svid(t)
	otherLeaf, otherKey := w.caA.Issue(t, spiffeid.RequireFromString("spiffe://a.test/db"))
	tests := []struct {
		name string
		st   State
		want string
	}{
		{"nil bundle", State{Bundles: []*spiffebundle.Bundle{nil}}, "bundle 0 is nil"},
		{"duplicate trust domain", State{Bundles: []*spiffebundle.Bundle{w.bundleA(t), w.bundleA(t)}}, "two bundles"},
		{"no own bundle", State{SVID: good, Bundles: []*spiffebundle.Bundle{w.bundleB(t)}}, "no bundle for the SVID's trust domain"},
		{"empty chain", State{SVID: &SVID{ID: web, Key: good.Key}, Bundles: []*spiffebundle.Bundle{w.bundleA(t)}}, "empty certificate chain"},
		{"leaf for another ID", State{SVID: &SVID{ID: web, Chain: []*x509.Certificate{otherLeaf}, Key: otherKey}, Bundles: []*spiffebundle.Bundle{w.bundleA(t)}}, "leaf is for spiffe://a.test/db"},
		{"key mismatch", State{SVID: &SVID{ID: web, Chain: good.Chain, Key: otherKey}, Bundles: []*spiffebundle.Bundle{w.bundleA(t)}}, "does not match"},
		{"SVID from a root its bundle lacks", State{SVID: good, Bundles: []*spiffebundle.Bundle{testca.New(t, tdA.Name()).Bundle()}}, "chain does not verify"},
		{"SVID vouched for by another trust domain's root only", State{SVID: good, Bundles: []*spiffebundle.Bundle{spiffebundle.FromX509Authorities(tdA, []*x509.Certificate{testca.New(t, tdA.Name()).Cert}), spiffebundle.FromX509Authorities(tdB, []*x509.Certificate{w.caA.Cert})}}, "chain does not verify"},
		{"CA leaf", State{SVID: &SVID{ID: tdA.ID(), Chain: []*x509.Certificate{w.caA.Cert}, Key: w.caA.Key}, Bundles: []*spiffebundle.Bundle{w.bundleA(t)}}, "leaf is a CA certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCell()
			before, changed := c.State()
			err := c.Set(tt.st)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			after, _ := c.State()
			assert.Same(t, before, after, "the previous state stays")
			select {
			case <-changed:
				t.Fatal("watchers woken by a refused state")
			default:
			}
		})
	}
}

func TestCellOrdersOwnTrustDomainFirst(t *testing.T) {
	w := newWorld(t)
	caC := testca.New(t, tdC.Name())
	c := NewCell()
	require.NoError(t, c.Set(State{SVID: w.svid(t), Bundles: []*spiffebundle.Bundle{caC.Bundle(), w.bundleB(t), w.bundleA(t)}}))
	st, _ := c.State()
	var got []spiffeid.TrustDomain
	for _, b := range st.Bundles {
		got = append(got, b.TrustDomain())
	}
	assert.Equal(t, []spiffeid.TrustDomain{tdA, tdB, tdC}, got)
}

// TestEncodeOncePerState: one encoding per State whatever the streams,
// and a change that leaves a response as it was (Stale alone; a rotation
// for the bundle streams) keeps that response's frame, so no stream is
// pushed a copy of what it has.
func TestEncodeOncePerState(t *testing.T) {
	w := newWorld(t)
	cell := NewCell()
	srv, err := New(Config{Source: cell})
	require.NoError(t, err)
	publish := func(st State) *State {
		require.NoError(t, cell.Set(st))
		cur, _ := cell.State()
		return cur
	}
	st1 := publish(State{SVID: w.svid(t), Bundles: []*spiffebundle.Bundle{w.bundleA(t), w.bundleB(t)}})
	e1 := srv.encoded(st1)
	assert.Same(t, e1, srv.encoded(st1))

	stale := *st1
	stale.Stale = errors.New("unreachable")
	st2 := publish(stale)
	e2 := srv.encoded(st2)
	assert.NotSame(t, e1, e2)
	assert.Same(t, e1.x509SVID, e2.x509SVID)
	assert.Same(t, e1.x509Bundles, e2.x509Bundles)
	assert.Same(t, e1.jwtBundles, e2.jwtBundles)

	st3 := publish(State{SVID: w.svid(t), Bundles: st1.Bundles})
	e3 := srv.encoded(st3)
	assert.NotSame(t, e2.x509SVID, e3.x509SVID)
	assert.Same(t, e2.x509Bundles, e3.x509Bundles, "a rotation leaves the bundles stream alone")
	assert.Same(t, e2.jwtBundles, e3.jwtBundles)

	// A stream late to st2 gets st2's encoding, without evicting st3's.
	assert.Same(t, e2, srv.encoded(st2))
	assert.Same(t, e3, srv.encoded(st3))

	var resp workloadpb.X509SVIDResponse
	require.NoError(t, proto.Unmarshal(e3.x509SVID.b, &resp))
	require.Len(t, resp.GetSvids(), 1)
	assert.Equal(t, st3.SVID.Chain[0].Raw, resp.GetSvids()[0].GetX509Svid())
	assert.Equal(t, w.caA.Cert.Raw, resp.GetSvids()[0].GetBundle())
	assert.Equal(t, map[string][]byte{tdB.IDString(): w.caB.Cert.Raw}, resp.GetFederatedBundles())
	assert.Equal(t, 3.0, testutil.ToFloat64(srv.metrics.encodings), "one encoding per State")
}

// TestLateStreamsShareEncoding: streams still on States that close Sets
// already replaced (a fan-out overtaken by the next Set) share one
// encoding per State instead of encoding it once each.
func TestLateStreamsShareEncoding(t *testing.T) {
	w := newWorld(t)
	cell := NewCell()
	srv, err := New(Config{Source: cell})
	require.NoError(t, err)
	const sets, streams = 5, 200
	var published []*State
	for range sets {
		require.NoError(t, cell.Set(State{SVID: w.svid(t), Bundles: []*spiffebundle.Bundle{w.bundleA(t)}}))
		st, _ := cell.State()
		published = append(published, st)
	}
	got := make([][]*encoded, sets)
	var wg sync.WaitGroup
	for i, st := range published {
		got[i] = make([]*encoded, streams)
		for j := range streams {
			wg.Go(func() { got[i][j] = srv.encoded(st) })
		}
	}
	wg.Wait()
	for i := range published {
		for j := range streams {
			require.Same(t, got[i][0], got[i][j], "state %d, stream %d", i, j)
		}
		assert.Same(t, published[i], got[i][0].state)
	}
	assert.Equal(t, float64(sets), testutil.ToFloat64(srv.metrics.encodings), "one encoding per State")
}

// FuzzValidateJWTSVID feeds arbitrary tokens and audiences to
// ValidateJWTSVID: it must never panic, and accept only what the key of
// the subject's trust domain signed for that audience.
func FuzzValidateJWTSVID(f *testing.F) {
	w := newWorld(f)
	f.Add("eyJhbGciOiJub25lIn0.e30.", "svc")
	f.Add("a.b.c", "svc")
	f.Add("", "")
	f.Add("eyJhbGciOiJFUzI1NiIsImtpZCI6ImtpZC1hIiwidHlwIjoiSldUIn0.eyJzdWIiOiJzcGlmZmU6Ly9hLnRlc3QveCIsImF1ZCI6WyJzdmMiXSwiZXhwIjo0MTAyNDQ0ODAwfQ.AAAA", "svc")
	cell := NewCell()
	require.NoError(f, cell.Set(State{SVID: w.svid(f), Bundles: []*spiffebundle.Bundle{w.bundleA(f)}}))
	srv, err := New(Config{Source: cell})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, token, aud string) {
		resp, err := srv.ValidateJWTSVID(context.Background(), &workloadpb.ValidateJWTSVIDRequest{Audience: aud, Svid: token})
		if err == nil {
			// Without the private key a fuzzer cannot forge a token.
			t.Fatalf("accepted a token no key signed: %q for %q: %v", token, aud, resp)
		}
	})
}

// TestJWTBundlesEncodeDeterministically: during a JWT key rotation a trust
// domain has several JWT authorities; equal States must encode to equal
// JWT bundle bytes (go-spiffe's jwtbundle Marshal follows map order), so
// that a State change that leaves them alone (Stale alone) pushes nothing
// to FetchJWTBundles watchers.
func TestJWTBundlesEncodeDeterministically(t *testing.T) {
	w := newWorld(t)
	rotating := func() *spiffebundle.Bundle {
		b := w.caA.Bundle()
		for _, kid := range []string{"k3", "k1", "k2"} {
			require.NoError(t, b.AddJWTAuthority(kid, w.jwtA.Public()))
		}
		return b
	}
	svid := w.svid(t)
	first := encodeState(&State{SVID: svid, Bundles: []*spiffebundle.Bundle{rotating()}}, nil)
	require.NoError(t, first.encodingFailed)
	for range 20 {
		again := encodeState(&State{SVID: svid, Bundles: []*spiffebundle.Bundle{rotating()}}, nil)
		require.Equal(t, first.jwtBundles.b, again.jwtBundles.b)
	}

	t.Run("a Stale-only change pushes nothing to a JWT bundles watcher", func(t *testing.T) {
		cell := NewCell()
		require.NoError(t, cell.Set(State{SVID: svid, Bundles: []*spiffebundle.Bundle{rotating()}}))
		addr, reg := serve(t, Config{Source: cell})
		ctx, cancel := context.WithTimeout(withHeader(context.Background()), waitFor)
		defer cancel()
		stream, err := rawClient(t, addr).FetchJWTBundles(ctx, &workloadpb.JWTBundlesRequest{})
		require.NoError(t, err)
		_, err = stream.Recv()
		require.NoError(t, err)
		for i := range 10 {
			st := State{SVID: svid, Bundles: []*spiffebundle.Bundle{rotating()}}
			if i%2 == 0 {
				st.Stale = errors.New("certificate service unreachable")
			}
			require.NoError(t, cell.Set(st))
		}
		// Then a real change: the next message the watcher gets must be it.
		changed := rotating()
		require.NoError(t, changed.AddJWTAuthority("k4", w.jwtB.Public()))
		require.NoError(t, cell.Set(State{SVID: svid, Bundles: []*spiffebundle.Bundle{changed}}))
		resp, err := stream.Recv()
		require.NoError(t, err)
		assert.Contains(t, string(resp.GetBundles()[tdA.IDString()]), `"k4"`, "the message after the Stale-only changes is the real change")
		assert.Equal(t, 2.0, testutil.ToFloat64(gatherOne(t, reg, "trustbridge_workload_api_pushes_total", map[string]string{"method": "FetchJWTBundles"})))
	})
}

// TestCellSetVerifiesAtACommonInstant: Check has no clock, so it verifies
// the SVID at an instant every certificate of the path is valid. The CA
// backdates leaves (ca/sign.go) even before its own NotBefore; with a
// plug-in CA whose signing certificate is the root, the leaf's NotBefore
// is before the root's, and the instant must come from the root too or
// the Workload API has nothing to serve until the next renewal. A chain
// to no root of the own trust domain, or to one never valid with it, is
// still refused.
func TestCellSetVerifiesAtACommonInstant(t *testing.T) {
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	root := testca.New(t, tdA.Name(), testca.Options{NotBefore: at(0), NotAfter: at(48 * time.Hour)})
	// later is a root prepared after root, valid from an hour on.
	later := testca.New(t, tdA.Name(), testca.Options{NotBefore: at(time.Hour), NotAfter: at(72 * time.Hour)})
	expired := testca.New(t, tdA.Name(), testca.Options{NotBefore: at(-48 * time.Hour), NotAfter: at(-24 * time.Hour)})
	backdated := testca.Options{NotBefore: at(-10 * time.Second), NotAfter: at(30 * time.Minute)}

	leaf, key := root.Issue(t, web, backdated)
	interKey := testca.NewKey(t, testca.ECP256)
	inter := testca.Sign(t, &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "intermediate"},
		NotBefore: at(-10 * time.Second), NotAfter: at(40 * time.Minute),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		URIs: []*url.URL{tdA.ID().URL()},
	}, root.Cert, interKey.Public(), root.Key)
	interCA := &testca.CA{TrustDomain: tdA, Cert: inter, Key: interKey}
	viaInter, viaInterKey := interCA.Issue(t, web, backdated)
	// stray is signed by expired but valid only after it expired.
	strayCA := &testca.CA{TrustDomain: tdA, Cert: expired.Cert, Key: expired.Key}
	stray, strayKey := strayCA.Issue(t, web, testca.Options{NotBefore: at(-10 * time.Second), Mutate: func(c *x509.Certificate) { c.NotAfter = at(time.Hour) }})

	bundle := func(roots ...*testca.CA) []*spiffebundle.Bundle {
		b := spiffebundle.New(tdA)
		for _, r := range roots {
			b.AddX509Authority(r.Cert)
		}
		return []*spiffebundle.Bundle{b}
	}
	tests := []struct {
		name    string
		chain   []*x509.Certificate
		key     crypto.Signer
		bundles []*spiffebundle.Bundle
		wantErr string
	}{
		{"leaf backdated before the root's NotBefore", []*x509.Certificate{leaf}, key, bundle(root), ""},
		{"the same with a later prepared root in the bundle", []*x509.Certificate{leaf}, key, bundle(later, root), ""},
		{"leaf and intermediate backdated before the root's NotBefore", []*x509.Certificate{viaInter, inter}, viaInterKey, bundle(root), ""},
		{"root not in the bundle", []*x509.Certificate{leaf}, key, bundle(later), "chain does not verify"},
		{"root never valid with the leaf", []*x509.Certificate{stray}, strayKey, bundle(expired, root), "chain does not verify"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := NewCell().Set(State{SVID: &SVID{ID: web, Chain: tt.chain, Key: tt.key}, Bundles: tt.bundles})
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}
