package agent

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/sds"
	wapi "github.com/trustbridge/trustbridge/sds/workload"
)

// TestComposeFollowsRotatorRootsWhileStale: without WatchBundles (an
// older server, an outage) the local bundle is the seed or the last good
// one; after a CA root rotation the Rotator's new certificate comes with
// the new local roots, and the Workload API must serve those with it, or
// the workload gets an SVID its own bundle rejects. Federated trust is
// never taken from the Rotator.
func TestComposeFollowsRotatorRootsWhileStale(t *testing.T) {
	caOld, caNew, caB, caC := testca.New(t, tdA.Name()), testca.New(t, tdA.Name()), testca.New(t, tdB.Name()), testca.New(t, tdC.Name())
	jwtKey := testca.NewKey(t, testca.ECP256)
	var trust atomic.Pointer[caclient.Trust]
	setTrust := func(ca *testca.CA) {
		trust.Store(&caclient.Trust{TrustDomain: tdA, Local: []*x509.Certificate{ca.Cert}, Bundles: map[spiffeid.TrustDomain][]*x509.Certificate{
			tdA: {ca.Cert}, tdC: {caC.Cert},
		}})
	}
	setTrust(caOld)
	creds := sds.NewCredentialCell(workload)
	leaf, key := caOld.Issue(t, workload)
	require.NoError(t, creds.Set([]*x509.Certificate{leaf}, key))
	own := caOld.Bundle()
	require.NoError(t, own.AddJWTAuthority("jwt-a", jwtKey.Public()))
	bundles := newBundleCell([]*spiffebundle.Bundle{own, caB.Bundle()}, errNoBundlesYet)
	out := wapi.NewCell()
	c := &composer{creds: creds, id: workload, bundles: bundles, trust: func() caclient.Trust { return *trust.Load() }, out: out, log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, c.Run(ctx)) })
	defer wg.Wait()
	defer cancel()

	serving := func(want *x509.Certificate) *wapi.State {
		t.Helper()
		var st *wapi.State
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			st, _ = out.State()
			if assert.NotNil(c, st.SVID) {
				assert.Equal(c, want.Raw, st.SVID.Chain[0].Raw)
			}
		}, 5*time.Second, time.Millisecond)
		return st
	}
	serving(leaf)

	setTrust(caNew)
	newLeaf, newKey := caNew.Issue(t, workload)
	require.NoError(t, creds.Set([]*x509.Certificate{newLeaf}, newKey))
	st := serving(newLeaf)
	require.Len(t, st.Bundles, 2)
	assert.Equal(t, tdA, st.Bundles[0].TrustDomain())
	assert.Equal(t, []*x509.Certificate{caNew.Cert}, st.Bundles[0].X509Authorities(), "the Rotator's local roots")
	assert.Contains(t, st.Bundles[0].JWTAuthorities(), "jwt-a", "the local JWT authorities stay")
	assert.Equal(t, tdB, st.Bundles[1].TrustDomain(), "federated bundles from WatchBundles only; c.test from the Rotator is not served")
	assert.Error(t, st.Stale)

	t.Run("fresh bundles from WatchBundles are served as they are", func(t *testing.T) {
		fresh := caNew.Bundle()
		fresh.AddX509Authority(caOld.Cert)
		_, changed := out.State()
		bundles.set([]*spiffebundle.Bundle{fresh})
		<-changed
		st, _ := out.State()
		require.Len(t, st.Bundles, 1)
		assert.True(t, st.Bundles[0].Equal(fresh))
		assert.NoError(t, st.Stale)
	})
}

// TestComposeStaleLocalRoots: while the bundles are stale, the local
// trust domain's X.509 authorities depend on whether WatchBundles ever
// delivered. The seed (never delivered) is the first certificate's roots,
// so the Rotator's replace them. Once delivered, the last good ones may
// carry a root the CA prepared after the agent's last renewal; a stream
// error (a server rolling restart) must not pull it from every workload,
// so the Rotator's roots are added to them. Federated trust is never
// taken from the Rotator.
func TestComposeStaleLocalRoots(t *testing.T) {
	r1, r2, r3 := testca.New(t, tdA.Name()), testca.New(t, tdA.Name()), testca.New(t, tdA.Name())
	caB, caC := testca.New(t, tdB.Name()), testca.New(t, tdC.Name())
	jwtKey := testca.NewKey(t, testca.ECP256)
	ownWith := func(roots ...*testca.CA) *spiffebundle.Bundle {
		b := spiffebundle.New(tdA)
		for _, r := range roots {
			b.AddX509Authority(r.Cert)
		}
		require.NoError(t, b.AddJWTAuthority("jwt-a", jwtKey.Public()))
		return b
	}
	tests := []struct {
		name string
		// prepare brings the seeded cell into the state under test, or
		// returns another.
		prepare func(seeded *bundleCell) *bundleCell
		rotator []*testca.CA
		want    []*x509.Certificate
	}{
		{
			name: "seed, outage before the first delivery: the Rotator's roots replace it",
			prepare: func(c *bundleCell) *bundleCell {
				c.setStale(errors.New("connection refused"))
				return c
			},
			rotator: []*testca.CA{r2},
			want:    []*x509.Certificate{r2.Cert},
		},
		{
			name: "delivered then stale: a prepared root learnt over WatchBundles stays",
			prepare: func(c *bundleCell) *bundleCell {
				c.set([]*spiffebundle.Bundle{ownWith(r1, r3), caB.Bundle()})
				c.setStale(errors.New("server restarting"))
				return c
			},
			rotator: []*testca.CA{r1},
			want:    []*x509.Certificate{r1.Cert, r3.Cert},
		},
		{
			name: "made fresh then stale: counts as delivered",
			prepare: func(*bundleCell) *bundleCell {
				c := newBundleCell([]*spiffebundle.Bundle{ownWith(r1, r3), caB.Bundle()}, nil)
				c.setStale(errors.New("server restarting"))
				return c
			},
			rotator: []*testca.CA{r1},
			want:    []*x509.Certificate{r1.Cert, r3.Cert},
		},
		{
			name: "delivered then stale, the Rotator renewed under a root not seen: both",
			prepare: func(c *bundleCell) *bundleCell {
				c.set([]*spiffebundle.Bundle{ownWith(r1, r3), caB.Bundle()})
				c.setStale(errors.New("server restarting"))
				return c
			},
			rotator: []*testca.CA{r1, r2},
			want:    []*x509.Certificate{r1.Cert, r3.Cert, r2.Cert},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := caclient.Trust{TrustDomain: tdA, Bundles: map[spiffeid.TrustDomain][]*x509.Certificate{tdC: {caC.Cert}}}
			for _, r := range tt.rotator {
				tr.Local = append(tr.Local, r.Cert)
			}
			tr.Bundles[tdA] = tr.Local
			creds := sds.NewCredentialCell(workload)
			leaf, key := tt.rotator[0].Issue(t, workload)
			require.NoError(t, creds.Set([]*x509.Certificate{leaf}, key))
			bundles := tt.prepare(newBundleCell([]*spiffebundle.Bundle{ownWith(r1), caB.Bundle()}, errNoBundlesYet))
			out := wapi.NewCell()
			c := &composer{creds: creds, id: workload, bundles: bundles, trust: func() caclient.Trust { return tr }, out: out, log: slog.New(slog.DiscardHandler)}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Go(func() { assert.NoError(t, c.Run(ctx)) })
			defer wg.Wait()
			defer cancel()

			var st *wapi.State
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				st, _ = out.State()
				assert.NotNil(c, st.SVID)
			}, 5*time.Second, time.Millisecond)
			require.Len(t, st.Bundles, 2)
			assert.Equal(t, tdA, st.Bundles[0].TrustDomain())
			assert.Equal(t, rawCerts(tt.want), rawCerts(st.Bundles[0].X509Authorities()))
			assert.Contains(t, st.Bundles[0].JWTAuthorities(), "jwt-a", "the local JWT authorities stay")
			assert.Equal(t, tdB, st.Bundles[1].TrustDomain(), "federated bundles from WatchBundles only; c.test from the Rotator is not served")
			assert.Error(t, st.Stale)
		})
	}
}

// rawCerts is certs' DER, for comparisons that print short diffs.
func rawCerts(certs []*x509.Certificate) [][]byte {
	out := make([][]byte, len(certs))
	for i, c := range certs {
		out[i] = c.Raw
	}
	return out
}
