package caclient

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

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
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// tdA is the local trust domain of these tests.
var tdA = spiffeid.RequireTrustDomainFromString("a.example")

func marshalMap(t testing.TB, bundles ...*spiffebundle.Bundle) []byte {
	doc, err := bundledoc.MarshalMap(bundles)
	require.NoError(t, err)
	return doc
}

func jwtBundleDocs(t testing.TB) (mapDoc, single []byte, key *ecdsa.PrivateKey) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	a := testca.New(t, tdA.Name()).Bundle().Clone()
	require.NoError(t, a.AddJWTAuthority("kid-a", key.Public()))
	mapDoc = marshalMap(t, a, testca.New(t, "b.example").Bundle())
	single, err = bundledoc.Marshal(a)
	require.NoError(t, err)
	return mapDoc, single, key
}

func TestParseBundles(t *testing.T) {
	mapDoc, single, key := jwtBundleDocs(t)
	for _, tc := range []struct {
		name    string
		doc     []byte
		td      spiffeid.TrustDomain
		want    []string
		wantErr string
	}{
		{"bundle map", mapDoc, spiffeid.TrustDomain{}, []string{"a.example", "b.example"}, ""},
		{"single bundle", single, tdA, []string{"a.example"}, ""},
		{"single bundle without trust domain", single, spiffeid.TrustDomain{}, nil, "--trust-domain"},
		{"bundle map with trust domain", mapDoc, tdA, nil, "applies to a single bundle only"},
		{"junk", []byte("{"), tdA, nil, "bundledoc"},
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
			jb, err := JWTSource(got).GetJWTBundleForTrustDomain(tdA)
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
// with Unauthenticated, as the server does when a credential expires;
// MintJWTSVID answers mint and records the request.
// Each message names subject (spiffe_id, "" as an older server) and the
// stream's request is recorded.
type fakeIdentity struct {
	identityapi.UnimplementedIdentityServiceServer
	msgs    [][]byte
	subject string
	mint    *identityapi.MintJWTSVIDResponse
	req     *identityapi.MintJWTSVIDRequest

	mu       sync.Mutex
	watchReq *identityapi.WatchBundlesRequest
}

func (f *fakeIdentity) WatchBundles(req *identityapi.WatchBundlesRequest, s grpc.ServerStreamingServer[identityapi.WatchBundlesResponse]) error {
	f.mu.Lock()
	f.watchReq = req
	f.mu.Unlock()
	for i, m := range f.msgs {
		if err := s.Send(&identityapi.WatchBundlesResponse{BundleMap: m, WithheldTrustDomains: []string{fmt.Sprint("w", i, ".example")}, SpiffeId: f.subject}); err != nil {
			return err
		}
	}
	return status.Error(codes.Unauthenticated, "credential expired")
}

func (f *fakeIdentity) MintJWTSVID(_ context.Context, req *identityapi.MintJWTSVIDRequest) (*identityapi.MintJWTSVIDResponse, error) {
	f.req = req
	return f.mint, nil
}

// serveIdentity serves f on loopback and returns a connection to it.
func serveIdentity(t *testing.T, f identityapi.IdentityServiceServer) *grpc.ClientConn {
	t.Helper()
	g := grpc.NewServer()
	identityapi.RegisterIdentityServiceServer(g, f)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// watchResult is one call of WatchBundles' fn.
type watchResult struct {
	b   *Bundles
	err error
}

func watchAll(conn grpc.ClientConnInterface, local spiffeid.TrustDomain) ([]watchResult, error) {
	var got []watchResult
	err := WatchBundles(context.Background(), conn, local, func(b *Bundles, err error) error {
		got = append(got, watchResult{b, err})
		return nil
	})
	return got, err
}

func TestWatchBundles(t *testing.T) {
	mapDoc, _, _ := jwtBundleDocs(t)
	empty := []byte(`{"trust_domains":{}}`)
	conn := serveIdentity(t, &fakeIdentity{msgs: [][]byte{mapDoc, empty, []byte("junk"), mapDoc}})

	t.Run("a bad message reaches fn and the stream goes on", func(t *testing.T) {
		got, err := watchAll(conn, spiffeid.TrustDomain{})
		require.Len(t, got, 4)
		require.NoError(t, got[0].err)
		assert.Len(t, got[0].b.Bundles, 2)
		assert.Equal(t, []string{"w0.example"}, got[0].b.Withheld)
		require.NoError(t, got[1].err, "without a local trust domain an empty map is no error")
		assert.Empty(t, got[1].b.Bundles)
		assert.Nil(t, got[2].b)
		require.Error(t, got[2].err)
		assert.Contains(t, got[2].err.Error(), "the server's bundle map")
		require.NoError(t, got[3].err, "the message after a bad one is read")
		assert.Equal(t, []string{"w3.example"}, got[3].b.Withheld)
		// The stream's own end comes back as its status.
		assert.Equal(t, codes.Unauthenticated, status.Code(err))
	})
	t.Run("the local trust domain is required when named", func(t *testing.T) {
		got, err := watchAll(conn, tdA)
		require.Len(t, got, 4)
		assert.NoError(t, got[0].err)
		assert.ErrorContains(t, got[1].err, "without the local trust domain a.example")
		assert.Error(t, got[2].err)
		assert.NoError(t, got[3].err)
		assert.Equal(t, codes.Unauthenticated, status.Code(err))
	})
	t.Run("an error from fn ends the watch", func(t *testing.T) {
		stop := errors.New("enough")
		calls := 0
		err := WatchBundles(context.Background(), conn, spiffeid.TrustDomain{}, func(*Bundles, error) error {
			calls++
			return stop
		})
		assert.ErrorIs(t, err, stop)
		assert.Equal(t, 1, calls)
	})
}

func TestFetchBundles(t *testing.T) {
	mapDoc, _, _ := jwtBundleDocs(t)
	for _, tc := range []struct {
		name    string
		first   []byte
		local   spiffeid.TrustDomain
		wantErr string
	}{
		{"first message", mapDoc, tdA, ""},
		{"first message without the local trust domain", []byte(`{"trust_domains":{}}`), tdA, "without the local trust domain"},
		{"first message bad", []byte("junk"), spiffeid.TrustDomain{}, "the server's bundle map"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := serveIdentity(t, &fakeIdentity{msgs: [][]byte{tc.first, mapDoc}})
			b, err := FetchBundles(context.Background(), conn, tc.local)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr, "fails closed, not on to the next message")
				assert.Nil(t, b)
				return
			}
			require.NoError(t, err)
			assert.Len(t, b.Bundles, 2)
			assert.Equal(t, []string{"w0.example"}, b.Withheld)
		})
	}
}

func TestParseWatchBundles(t *testing.T) {
	a, b := testca.New(t, tdA.Name()).Bundle(), testca.New(t, "b.example").Bundle()
	tests := []struct {
		name     string
		doc      []byte
		withheld int
		want     string
	}{
		{"local and federated", marshalMap(t, a, b), MaxTrustDomains, ""},
		{"no local trust domain", marshalMap(t, b), 0, "without the local trust domain"},
		{"not JSON", []byte("{"), 0, "bundle map"},
		{"too large", make([]byte, MaxBundleMapBytes+1), 0, "at most"},
		{"too many withheld", marshalMap(t, a, b), MaxTrustDomains + 1, "at most"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := &identityapi.WatchBundlesResponse{BundleMap: tt.doc, WithheldTrustDomains: make([]string, tt.withheld)}
			got, err := ParseWatchBundles(msg, tdA)
			if tt.want == "" {
				require.NoError(t, err)
				assert.Len(t, got.Bundles, 2)
				assert.Len(t, got.Withheld, tt.withheld)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	t.Run("JWT issuer", func(t *testing.T) {
		msg := &identityapi.WatchBundlesResponse{BundleMap: marshalMap(t, a), JwtIssuer: "https://oidc.a.example"}
		got, err := ParseWatchBundles(msg, tdA)
		require.NoError(t, err)
		assert.Equal(t, "https://oidc.a.example", got.JWTIssuer)
		msg.JwtIssuer = "http://oidc.a.example"
		got, err = ParseWatchBundles(msg, tdA)
		require.NoError(t, err, "the bundles are still taken")
		assert.Len(t, got.Bundles, 1)
		assert.Empty(t, got.JWTIssuer)
		assert.ErrorContains(t, got.JWTIssuerErr, "the server's JWT issuer: issuer \"http://oidc.a.example\": scheme must be https")
	})
	t.Run("too many trust domains", func(t *testing.T) {
		var doc strings.Builder
		doc.WriteString(`{"trust_domains":{"a.example":{"keys":[]}`)
		for i := range MaxTrustDomains {
			fmt.Fprintf(&doc, `,"t%d.example":{"keys":[]}`, i)
		}
		doc.WriteString("}}")
		_, err := ParseWatchBundles(&identityapi.WatchBundlesResponse{BundleMap: []byte(doc.String())}, tdA)
		assert.ErrorContains(t, err, "trust domains; at most")
	})
}

// FuzzParseWatchBundles: whatever the server sends, and whatever the
// stream asked for, ParseWatchBundlesWith refuses it or returns each trust
// domain once, the local one among them, for the workload asked for, with
// peer limits only when asked for, each of a federated trust domain of the
// map, with peers of that trust domain.
func FuzzParseWatchBundles(f *testing.F) {
	one := marshalMap(f, testca.New(f, tdA.Name()).Bundle())
	two := marshalMap(f, testca.New(f, tdA.Name()).Bundle(), testca.New(f, "b.example").Bundle())
	f.Add(one, "", "", "", "", false)
	f.Add([]byte(`{"trust_domains":{"a.example":{"keys":[]}}}`), "spiffe://a.example/w", "", "", "", false)
	f.Add([]byte(`{"trust_domains":{"a.example":{"keys":[]},"a.example":{"keys":[]}}}`), "", "", "", "", false)
	f.Add(two, "spiffe://a.example/ns/x/sa/y", "b.example", "spiffe://b.example/api\nspiffe://b.example/ns/*", "spiffe://a.example/ns/x/sa/y", true)
	f.Add(two, "spiffe://a.example/ns/x/sa/y", "b.example", "spiffe://b.example/api", "", false)
	f.Add(two, "", "b.example", "spiffe://c.example/api", "spiffe://a.example/ns/x/sa/y", true)
	f.Add(two, "spiffe://a.example/w", "a.example", "spiffe://a.example/*", "", true)
	f.Fuzz(func(t *testing.T, doc []byte, subject, limitTD, peers, impersonate string, peerLimits bool) {
		msg := &identityapi.WatchBundlesResponse{BundleMap: doc, SpiffeId: subject}
		if limitTD != "" || peers != "" {
			msg.PeerLimits = []*identityapi.PeerLimit{{TrustDomain: limitTD, Peers: strings.Split(peers, "\n")}}
		}
		opts := WatchOptions{PeerLimits: peerLimits}
		if id, err := spiffeid.FromString(impersonate); err == nil {
			opts.Impersonate = id
		}
		got, err := ParseWatchBundlesWith(msg, tdA, opts)
		if err != nil {
			return
		}
		seen := map[spiffeid.TrustDomain]bool{}
		for _, b := range got.Bundles {
			require.False(t, seen[b.TrustDomain()], "a trust domain twice")
			seen[b.TrustDomain()] = true
		}
		require.True(t, seen[tdA])
		if !opts.Impersonate.IsZero() {
			require.Equal(t, opts.Impersonate, got.ID, "the workload asked for, nobody else")
		}
		if !got.ID.IsZero() {
			require.True(t, got.ID.MemberOf(tdA))
		}
		if !peerLimits {
			require.Empty(t, got.PeerLimits)
		}
		for td, ps := range got.PeerLimits {
			require.True(t, seen[td], "a limited trust domain's bundle is in the map")
			require.NotEqual(t, tdA, td)
			require.NotEmpty(t, ps)
			for _, s := range ps {
				p, err := trustpolicy.ParsePattern(s)
				require.NoError(t, err)
				require.Equal(t, td, p.TrustDomain())
			}
		}
	})
}

// ParseWatchBundlesWith: the subject and the peer limits are untrusted
// input, checked against what the stream asked for.
func TestParseWatchBundlesWith(t *testing.T) {
	doc := marshalMap(t, testca.New(t, tdA.Name()).Bundle(), testca.New(t, "b.example").Bundle(), testca.New(t, "c.example").Bundle())
	workload := spiffeid.RequireFromString("spiffe://a.example/ns/shop/sa/web")
	node := spiffeid.RequireFromString("spiffe://a.example/ns/istio-system/sa/ztunnel")
	both := WatchOptions{Impersonate: workload, PeerLimits: true}
	limit := func(td string, peers ...string) *identityapi.PeerLimit {
		return &identityapi.PeerLimit{TrustDomain: td, Peers: peers}
	}
	many := func(td string, n int) *identityapi.PeerLimit {
		l := limit(td)
		for i := range n {
			l.Peers = append(l.Peers, fmt.Sprintf("spiffe://%s/p%d", td, i))
		}
		return l
	}
	tooMany := make([]*identityapi.PeerLimit, MaxTrustDomains+1)
	for i := range tooMany {
		tooMany[i] = limit("b.example", "spiffe://b.example/api")
	}
	for _, tc := range []struct {
		name    string
		subject string
		limits  []*identityapi.PeerLimit
		opts    WatchOptions
		wantErr string
	}{
		{"the workload's, with peer limits", workload.String(), []*identityapi.PeerLimit{limit("b.example", "spiffe://b.example/api", "spiffe://b.example/ns/*")}, both, ""},
		{"the caller's own", node.String(), nil, WatchOptions{}, ""},
		{"an older server names nobody", "", nil, WatchOptions{}, ""},
		{"an older server ignored the impersonation", "", nil, both, "too old for impersonated bundle watches"},
		{"another workload's", "spiffe://a.example/ns/shop/sa/api", nil, both, "not of " + workload.String()},
		{"the caller's instead of the workload's", node.String(), nil, both, "not of " + workload.String()},
		{"invalid spiffe_id", "a.example/w", nil, WatchOptions{}, "invalid spiffe_id"},
		{"a subject of another trust domain", "spiffe://b.example/w", nil, WatchOptions{}, "not of a workload of the local trust domain a.example"},
		{"peer limits not asked for", workload.String(), []*identityapi.PeerLimit{limit("b.example", "spiffe://b.example/api")}, WatchOptions{Impersonate: workload}, "not asked for"},
		{"a trust domain not in the map", workload.String(), []*identityapi.PeerLimit{limit("d.example", "spiffe://d.example/api")}, both, "not in the bundle map"},
		{"the local trust domain", workload.String(), []*identityapi.PeerLimit{limit("a.example", "spiffe://a.example/api")}, both, "trusted whole"},
		{"a trust domain twice", workload.String(), []*identityapi.PeerLimit{limit("b.example", "spiffe://b.example/api"), limit("b.example", "spiffe://b.example/web")}, both, "named twice"},
		{"not a trust domain name", workload.String(), []*identityapi.PeerLimit{limit("spiffe://b.example", "spiffe://b.example/api")}, both, "not a trust domain name"},
		{"no peers", workload.String(), []*identityapi.PeerLimit{limit("b.example")}, both, "no peers"},
		{"a peer that is no pattern", workload.String(), []*identityapi.PeerLimit{limit("b.example", "spiffe://b.example/a*")}, both, "'*' is allowed only"},
		{"a peer of another trust domain", workload.String(), []*identityapi.PeerLimit{limit("b.example", "spiffe://c.example/api")}, both, "not of that trust domain"},
		{"too many peers in all", workload.String(), []*identityapi.PeerLimit{many("b.example", MaxPeers/2+1), many("c.example", MaxPeers/2)}, both, fmt.Sprintf("more than %d peers", MaxPeers)},
		{"too many peer limits", workload.String(), tooMany, both, "at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := &identityapi.WatchBundlesResponse{BundleMap: doc, SpiffeId: tc.subject, PeerLimits: tc.limits}
			got, err := ParseWatchBundlesWith(msg, tdA, tc.opts)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				assert.Nil(t, got)
				return
			}
			require.NoError(t, err)
			assert.Len(t, got.Bundles, 3)
			if tc.subject != "" {
				assert.Equal(t, tc.subject, got.ID.String())
			} else {
				assert.True(t, got.ID.IsZero())
			}
			want := map[spiffeid.TrustDomain][]string{}
			for _, l := range tc.limits {
				want[spiffeid.RequireTrustDomainFromString(l.TrustDomain)] = l.Peers
			}
			if len(want) == 0 {
				want = nil
			}
			assert.Equal(t, want, got.PeerLimits)
		})
	}
}

// WatchBundlesWith asks for what opts say and refuses what an older
// server sends in answer: the caller's own trust for the workload's.
func TestWatchBundlesWith(t *testing.T) {
	mapDoc, _, _ := jwtBundleDocs(t)
	workload := spiffeid.RequireFromString("spiffe://a.example/ns/shop/sa/web")
	opts := WatchOptions{Impersonate: workload, PeerLimits: true}
	watch := func(f *fakeIdentity) ([]watchResult, error) {
		var got []watchResult
		err := WatchBundlesWith(t.Context(), serveIdentity(t, f), tdA, opts, func(b *Bundles, err error) error {
			got = append(got, watchResult{b, err})
			return nil
		})
		return got, err
	}

	f := &fakeIdentity{msgs: [][]byte{mapDoc}, subject: workload.String()}
	got, err := watch(f)
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	require.Len(t, got, 1)
	require.NoError(t, got[0].err)
	assert.Equal(t, workload, got[0].b.ID)
	f.mu.Lock()
	assert.Equal(t, workload.String(), f.watchReq.GetImpersonatedIdentity())
	assert.True(t, f.watchReq.GetPeerLimits())
	f.mu.Unlock()

	got, _ = watch(&fakeIdentity{msgs: [][]byte{mapDoc}})
	require.Len(t, got, 1)
	assert.ErrorContains(t, got[0].err, "too old for impersonated bundle watches", "fails closed")
	assert.Nil(t, got[0].b)

	err = WatchBundlesWith(t.Context(), serveIdentity(t, &fakeIdentity{}), tdA, WatchOptions{Impersonate: spiffeid.RequireFromString("spiffe://a.example")},
		func(*Bundles, error) error { return nil })
	assert.ErrorContains(t, err, "names a trust domain, not a workload")
}

func TestMintJWTSVID(t *testing.T) {
	good := &identityapi.MintJWTSVIDResponse{Token: "tok", SpiffeId: "spiffe://a.example/w", ExpiresAt: 1_800_000_000}
	for _, tc := range []struct {
		name    string
		resp    *identityapi.MintJWTSVIDResponse
		ttl     time.Duration
		wantTTL int64
		wantErr string
	}{
		{"server's lifetime", good, 0, 0, ""},
		{"ttl rounded up to whole seconds", good, 1500 * time.Millisecond, 2, ""},
		{"negative ttl", good, -time.Second, 0, "negative"},
		{"invalid spiffe_id", &identityapi.MintJWTSVIDResponse{Token: "tok", SpiffeId: "a.example/w"}, 0, 0, "invalid spiffe_id"},
		{"empty token", &identityapi.MintJWTSVIDResponse{SpiffeId: "spiffe://a.example/w"}, 0, 0, "empty token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeIdentity{mint: tc.resp}
			svid, err := MintJWTSVID(context.Background(), serveIdentity(t, f), []string{"x", "y"}, tc.ttl)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				assert.Nil(t, svid)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, &JWTSVID{Token: "tok", ID: spiffeid.RequireFromString("spiffe://a.example/w"), ExpiresAt: time.Unix(1_800_000_000, 0).UTC()}, svid)
			assert.Equal(t, []string{"x", "y"}, f.req.GetAudience())
			assert.Equal(t, tc.wantTTL, f.req.GetTtlSeconds())
		})
	}
}

// MintJWTSVIDFor asks for the workload and accepts a token of that
// workload only: an older server ignores the field and signs the caller.
func TestMintJWTSVIDFor(t *testing.T) {
	web := spiffeid.RequireFromString("spiffe://a.example/ns/shop/sa/web")
	f := &fakeIdentity{mint: &identityapi.MintJWTSVIDResponse{Token: "tok", SpiffeId: web.String(), ExpiresAt: 1_800_000_000}}
	svid, err := MintJWTSVIDFor(context.Background(), serveIdentity(t, f), web, []string{"db"}, 0)
	require.NoError(t, err)
	assert.Equal(t, web, svid.ID)
	assert.Equal(t, web.String(), f.req.GetImpersonatedIdentity())

	old := &fakeIdentity{mint: &identityapi.MintJWTSVIDResponse{Token: "tok", SpiffeId: "spiffe://a.example/ns/kube-system/sa/agent", ExpiresAt: 1_800_000_000}}
	svid, err = MintJWTSVIDFor(context.Background(), serveIdentity(t, old), web, []string{"db"}, 0)
	assert.ErrorContains(t, err, "too old to mint for the workloads of a node agent")
	assert.Nil(t, svid)

	_, err = MintJWTSVIDFor(context.Background(), serveIdentity(t, f), spiffeid.RequireFromString("spiffe://a.example"), []string{"db"}, 0)
	assert.ErrorContains(t, err, "not a SPIFFE ID of a workload")
	_, err = MintJWTSVID(context.Background(), serveIdentity(t, f), []string{"db"}, 0)
	require.NoError(t, err)
	assert.Empty(t, f.req.GetImpersonatedIdentity(), "the caller's own asks for nobody else")
}
