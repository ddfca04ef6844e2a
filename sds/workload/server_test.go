package workload

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

const waitFor = 5 * time.Second

func clientOpts(addr string) workloadapi.SourceOption {
	return workloadapi.WithClientOptions(workloadapi.WithAddr(addr))
}

func TestX509SourceFollowsRotationAndFederation(t *testing.T) {
	w := newWorld(t)
	cell := NewCell()
	first := w.svid(t)
	require.NoError(t, cell.Set(State{SVID: first, Bundles: []*spiffebundle.Bundle{w.bundleB(t), w.bundleA(t)}}))
	var logs syncBuffer
	addr, reg := serve(t, Config{Source: cell, Logger: slog.New(slog.NewTextHandler(&logs, nil))})

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	src, err := workloadapi.NewX509Source(ctx, clientOpts(addr))
	require.NoError(t, err)
	defer src.Close()
	bundles, err := workloadapi.NewBundleSource(ctx, clientOpts(addr))
	require.NoError(t, err)
	defer bundles.Close()

	got, err := src.GetX509SVID()
	require.NoError(t, err)
	assert.Equal(t, web, got.ID)
	assert.Equal(t, first.Chain[0].Raw, got.Certificates[0].Raw)
	b, err := src.GetX509BundleForTrustDomain(tdB)
	require.NoError(t, err, "federated_bundles carries b.test")
	assert.True(t, b.HasX509Authority(w.caB.Cert))
	own, err := src.GetX509BundleForTrustDomain(tdA)
	require.NoError(t, err)
	assert.True(t, own.HasX509Authority(w.caA.Cert))

	t.Run("rotation reaches the source", func(t *testing.T) {
		next := w.svid(t)
		require.NoError(t, cell.Set(State{SVID: next, Bundles: []*spiffebundle.Bundle{w.bundleA(t), w.bundleB(t)}}))
		assert.EventuallyWithT(t, func(c *assert.CollectT) {
			got, err := src.GetX509SVID()
			if assert.NoError(c, err) {
				assert.Equal(c, next.Chain[0].Raw, got.Certificates[0].Raw)
			}
		}, waitFor, 5*time.Millisecond)
	})

	t.Run("a peer's new root reaches both sources", func(t *testing.T) {
		rotated := testcaRoot(t, tdB)
		nb := w.bundleB(t)
		nb.AddX509Authority(rotated)
		require.NoError(t, cell.Set(State{SVID: first, Bundles: []*spiffebundle.Bundle{w.bundleA(t), nb}}))
		assert.EventuallyWithT(t, func(c *assert.CollectT) {
			b, err := src.GetX509BundleForTrustDomain(tdB)
			if assert.NoError(c, err) {
				assert.True(c, b.HasX509Authority(rotated))
			}
			jb, err := bundles.GetX509BundleForTrustDomain(tdB)
			if assert.NoError(c, err) {
				assert.True(c, jb.HasX509Authority(rotated))
			}
		}, waitFor, 5*time.Millisecond)
	})

	t.Run("a withdrawn trust domain disappears", func(t *testing.T) {
		require.NoError(t, cell.Set(State{SVID: first, Bundles: []*spiffebundle.Bundle{w.bundleA(t)}}))
		assert.EventuallyWithT(t, func(c *assert.CollectT) {
			_, err := src.GetX509BundleForTrustDomain(tdB)
			assert.Error(c, err)
			_, err = bundles.GetBundleForTrustDomain(tdB)
			assert.Error(c, err)
			_, err = bundles.GetJWTBundleForTrustDomain(tdB)
			assert.Error(c, err)
		}, waitFor, 5*time.Millisecond)
		_, err := bundles.GetJWTBundleForTrustDomain(tdA)
		assert.NoError(t, err, "the own trust domain's JWT bundle stays")
	})

	t.Run("a stale state is still served, and shown", func(t *testing.T) {
		staleGauge := func() float64 {
			return testutil.ToFloat64(gatherOne(t, reg, "trustbridge_workload_api_stale", nil))
		}
		require.Equal(t, 0.0, staleGauge())
		st, _ := cell.State()
		stale := *st
		stale.Stale = errors.New("certificate service unreachable")
		require.NoError(t, cell.Set(stale))
		assert.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Equal(c, 1.0, staleGauge())
			assert.Contains(c, logs.String(), "certificate service unreachable")
		}, waitFor, 5*time.Millisecond)
		defer func() {
			require.NoError(t, cell.Set(*st))
			assert.EventuallyWithT(t, func(c *assert.CollectT) {
				assert.Equal(c, 0.0, staleGauge())
				assert.Contains(c, logs.String(), "current identity and bundles again")
			}, waitFor, 5*time.Millisecond)
		}()
		got, err := src.GetX509SVID()
		require.NoError(t, err)
		assert.Equal(t, first.Chain[0].Raw, got.Certificates[0].Raw)
		// A fresh client gets the stale state at once.
		c, err := workloadapi.New(ctx, workloadapi.WithAddr(addr))
		require.NoError(t, err)
		defer c.Close()
		fetched, err := c.FetchX509SVID(ctx)
		require.NoError(t, err)
		assert.Equal(t, first.Chain[0].Raw, fetched.Certificates[0].Raw)
	})

	// The one-shot fetch's stream ends on the server shortly after its
	// client cancelled it.
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, 2.0, testutil.ToFloat64(mustGauge(t, reg, "FetchX509SVID")), "open streams: the X509Source's and the BundleSource's")
	}, waitFor, 5*time.Millisecond)
}

func TestNoIdentityPermissionDenied(t *testing.T) {
	addr, reg := serve(t, Config{Source: NewCell()})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, err := workloadapi.New(ctx, workloadapi.WithAddr(addr))
	require.NoError(t, err)
	defer c.Close()

	_, err = c.FetchX509SVID(ctx)
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "no identity issued")
	_, err = c.FetchX509Bundles(ctx)
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	_, err = c.FetchJWTBundles(ctx)
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	_, err = c.FetchJWTSVID(ctx, jwtsvid.Params{Audience: "svc"})
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.Equal(t, 1.0, testutil.ToFloat64(mustRequests(t, reg, "FetchX509SVID", codes.PermissionDenied)))
}

func TestSecurityHeaderRequired(t *testing.T) {
	w := newWorld(t)
	cell := NewCell()
	require.NoError(t, cell.Set(State{SVID: w.svid(t), Bundles: []*spiffebundle.Bundle{w.bundleA(t)}}))
	addr, reg := serve(t, Config{Source: cell, JWT: signer{w.jwtA, kidA, web}})
	client := rawClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	for name, md := range map[string]metadata.MD{
		"missing": nil,
		"false":   metadata.Pairs(Header, "false"),
		"twice":   metadata.Pairs(Header, "true", Header, "true"),
	} {
		t.Run(name, func(t *testing.T) {
			ctx := metadata.NewOutgoingContext(ctx, md)
			st, err := client.FetchX509SVID(ctx, &workloadpb.X509SVIDRequest{})
			require.NoError(t, err)
			_, err = st.Recv()
			assert.Equal(t, codes.InvalidArgument, status.Code(err))
			_, err = client.FetchJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{"svc"}})
			assert.Equal(t, codes.InvalidArgument, status.Code(err))
			assert.Contains(t, status.Convert(err).Message(), "security header")
		})
	}
	assert.Equal(t, 3.0, testutil.ToFloat64(mustRequests(t, reg, "FetchJWTSVID", codes.InvalidArgument)))
}
