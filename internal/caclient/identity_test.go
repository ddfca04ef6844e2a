package caclient

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"net"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/identityapi"
	"github.com/trustbridge/trustbridge/internal/testca"
)

func jwtBundleDocs(t testing.TB) (mapDoc, single []byte, key *ecdsa.PrivateKey) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	a := testca.New(t, "a.example").Bundle().Clone()
	require.NoError(t, a.AddJWTAuthority("kid-a", key.Public()))
	b := testca.New(t, "b.example").Bundle()
	mapDoc, err = bundledoc.MarshalMap([]*spiffebundle.Bundle{a, b})
	require.NoError(t, err)
	single, err = bundledoc.Marshal(a)
	require.NoError(t, err)
	return mapDoc, single, key
}

func TestParseBundles(t *testing.T) {
	mapDoc, single, key := jwtBundleDocs(t)
	a := spiffeid.RequireTrustDomainFromString("a.example")
	for _, tc := range []struct {
		name    string
		doc     []byte
		td      spiffeid.TrustDomain
		want    []string
		wantErr string
	}{
		{"bundle map", mapDoc, spiffeid.TrustDomain{}, []string{"a.example", "b.example"}, ""},
		{"single bundle", single, a, []string{"a.example"}, ""},
		{"single bundle without trust domain", single, spiffeid.TrustDomain{}, nil, "--trust-domain"},
		{"bundle map with trust domain", mapDoc, a, nil, "applies to a single bundle only"},
		{"junk", []byte("{"), a, nil, "bundledoc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseBundles(tc.doc, tc.td)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			var names []string
			for _, b := range got {
				names = append(names, b.TrustDomain().Name())
			}
			assert.Equal(t, tc.want, names)
			jb, err := JWTSource(got).GetJWTBundleForTrustDomain(a)
			require.NoError(t, err)
			k, ok := jb.FindJWTAuthority("kid-a")
			require.True(t, ok)
			assert.True(t, key.PublicKey.Equal(k))
		})
	}
}

// FuzzParseBundles: whatever the file holds, ParseBundles returns bundles
// or an error, never a panic, and only bundles of the trust domain named
// when it reads a single bundle.
func FuzzParseBundles(f *testing.F) {
	mapDoc, single, _ := jwtBundleDocs(f)
	f.Add(mapDoc, "")
	f.Add(single, "a.example")
	f.Add(single, "")
	f.Add([]byte(`{"trust_domains":{}}`), "")
	f.Add([]byte(`{"keys":[]}`), "x.example")
	f.Fuzz(func(t *testing.T, doc []byte, name string) {
		td, err := spiffeid.TrustDomainFromString(name)
		if err != nil {
			td = spiffeid.TrustDomain{}
		}
		got, err := ParseBundles(doc, td)
		if err != nil {
			return
		}
		for _, b := range got {
			require.NotNil(t, b)
			if !td.IsZero() {
				assert.Equal(t, td, b.TrustDomain())
			}
		}
	})
}

// fakeIdentity sends each of msgs on WatchBundles, then ends the stream
// with Unauthenticated, as the server does when a credential expires.
type fakeIdentity struct {
	identityapi.UnimplementedIdentityServiceServer
	msgs [][]byte
}

func (f *fakeIdentity) WatchBundles(_ *identityapi.WatchBundlesRequest, s grpc.ServerStreamingServer[identityapi.WatchBundlesResponse]) error {
	for i, m := range f.msgs {
		if err := s.Send(&identityapi.WatchBundlesResponse{BundleMap: m, WithheldTrustDomains: []string{fmt.Sprint("w", i, ".example")}}); err != nil {
			return err
		}
	}
	return status.Error(codes.Unauthenticated, "credential expired")
}

func TestWatchBundles(t *testing.T) {
	mapDoc, _, _ := jwtBundleDocs(t)
	g := grpc.NewServer()
	identityapi.RegisterIdentityServiceServer(g, &fakeIdentity{msgs: [][]byte{mapDoc, []byte(`{"trust_domains":{}}`), []byte("junk")}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })

	var got []*Bundles
	err = WatchBundles(context.Background(), conn, func(b *Bundles) error {
		got = append(got, b)
		return nil
	})
	require.Len(t, got, 2)
	assert.Len(t, got[0].Bundles, 2)
	assert.Equal(t, []string{"w0.example"}, got[0].Withheld)
	assert.Empty(t, got[1].Bundles)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the server's bundle map", "a bad map ends the watch")

	// The stream's own end comes back as its status.
	g2 := grpc.NewServer()
	identityapi.RegisterIdentityServiceServer(g2, &fakeIdentity{msgs: [][]byte{mapDoc}})
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = g2.Serve(ln2) }()
	t.Cleanup(g2.Stop)
	conn2, err := grpc.NewClient(ln2.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn2.Close() })
	err = WatchBundles(context.Background(), conn2, func(*Bundles) error { return nil })
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
}
