package certservice

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// FuzzMintRequest drives the validation of MintJWTSVID requests with
// arbitrary wire bytes: whatever parses, checkMintRequest either refuses
// it with InvalidArgument or returns 1 to MaxAudiences non-empty, bounded,
// UTF-8 audiences and a lifetime that is not negative.
func FuzzMintRequest(f *testing.F) {
	for _, req := range []*identityapi.MintJWTSVIDRequest{
		{},
		{Audience: []string{"a"}},
		{Audience: []string{"https://api.example.com", "b"}, TtlSeconds: 300},
		{Audience: []string{""}},
		{Audience: []string{"a"}, TtlSeconds: -1},
		{Audience: []string{"a"}, TtlSeconds: 1 << 62},
		{Audience: []string{strings.Repeat("x", MaxAudienceBytes+1)}},
		{Audience: make([]string, MaxAudiences+1)},
	} {
		b, err := proto.Marshal(req)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x02, 0xff, 0xfe}) // an audience that is not UTF-8
	f.Fuzz(func(t *testing.T, wire []byte) {
		var req identityapi.MintJWTSVIDRequest
		if proto.Unmarshal(wire, &req) != nil {
			return
		}
		aud, ttl, ref := checkMintRequest(&req)
		if ref != nil {
			assert.Equal(t, codes.InvalidArgument, ref.code)
			assert.NotEmpty(t, ref.msg)
			return
		}
		require.NotEmpty(t, aud)
		assert.LessOrEqual(t, len(aud), MaxAudiences)
		for _, a := range aud {
			assert.NotEmpty(t, a)
			assert.LessOrEqual(t, len(a), MaxAudienceBytes)
			assert.True(t, utf8.ValidString(a))
			assert.False(t, strings.ContainsFunc(a, unicode.IsControl))
		}
		assert.GreaterOrEqual(t, int64(ttl), int64(0))
	})
}

// FuzzMintJWTSVIDs drives MintJWTSVIDs with arbitrary wire bytes, from
// no caller, a node agent that may act for one workload, or a caller that
// may act for none: it never panics, answers a result an item or refuses
// the batch as a whole (exactly when it is malformed or the caller not
// authenticated) with nothing signed, and never signs for a subject but
// the caller or the workload it may act for.
func FuzzMintJWTSVIDs(f *testing.F) {
	agent := spiffeid.RequireFromString("spiffe://example.org/ns/istio-system/sa/ztunnel")
	plain := spiffeid.RequireFromString("spiffe://example.org/vm/laptop")
	web := spiffeid.RequireFromString("spiffe://example.org/ns/shop/sa/web")
	callers := map[string]authn.Identity{
		"agent-token": {ID: agent, Method: authn.MethodKubernetesJWT, Grant: &authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "istio-system/ztunnel"}},
		"plain-token": {ID: plain, Method: "fake-token"},
	}
	var (
		mu     sync.Mutex
		signed []spiffeid.ID
	)
	svc, err := New(Config{
		Signer: SignerFunc(func(ca.X509SVIDParams) (*ca.Issued, error) { return nil, errors.New("no certificates here") }),
		Authenticator: authn.AuthenticatorFunc(func(_ context.Context, r authn.Request) (authn.Identity, error) {
			if ident, ok := callers[r.BearerToken]; ok {
				return ident, nil
			}
			return authn.Identity{}, authn.ErrNoCredentials
		}),
		Impersonator: impersonatorFunc(func(_ context.Context, caller authn.Identity, target spiffeid.ID) error {
			if caller.ID != agent || target != web {
				return errors.New("not on this node")
			}
			return nil
		}),
		JWT: JWTSignerFunc(func(id spiffeid.ID, _ []string, ttl time.Duration) (string, time.Time, error) {
			mu.Lock()
			signed = append(signed, id)
			mu.Unlock()
			if ttl == 0 || ttl > time.Hour {
				ttl = time.Hour
			}
			return "token-of." + id.String(), time.Now().Add(ttl), nil
		}),
		Registerer: prometheus.NewRegistry(),
	})
	require.NoError(f, err)
	is := &identityService{s: svc}
	tokens := []string{"", "agent-token", "plain-token"} // no caller, or one of callers

	seeds := []*identityapi.MintJWTSVIDsRequest{
		{},
		{Requests: []*identityapi.MintJWTSVIDRequest{{Audience: []string{"a"}}}},
		{Requests: []*identityapi.MintJWTSVIDRequest{
			{Audience: []string{"a"}, ImpersonatedIdentity: web.String()},
			{Audience: []string{"b"}, ImpersonatedIdentity: "spiffe://example.org/ns/shop/sa/api"},
			{Audience: []string{"c"}, ImpersonatedIdentity: "spiffe://other.example/ns/shop/sa/web"},
			{Audience: []string{""}},
			{Audience: []string{"d"}, TtlSeconds: -1},
			{Audience: []string{"e\x00"}, TtlSeconds: 1 << 62},
			{ImpersonatedIdentity: web.String()},
		}},
		{Requests: make([]*identityapi.MintJWTSVIDRequest, identityapi.MaxMintBatch+1)},
		{Requests: []*identityapi.MintJWTSVIDRequest{{Audience: []string{strings.Repeat("x", maxMintRequestSize)}}}},
	}
	for _, req := range seeds {
		b, err := proto.Marshal(req)
		require.NoError(f, err)
		for who := range uint8(len(tokens)) {
			f.Add(b, who)
		}
	}
	f.Fuzz(func(t *testing.T, wire []byte, who uint8) {
		var req identityapi.MintJWTSVIDsRequest
		if proto.Unmarshal(wire, &req) != nil {
			return
		}
		mu.Lock()
		signed = nil
		mu.Unlock()
		ctx, token := t.Context(), tokens[int(who)%len(tokens)]
		if token != "" {
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+token))
		}
		caller, authenticated := callers[token]
		malformed := proto.Size(&req) > identityapi.MaxMintBatchBytes || len(req.GetRequests()) == 0 || len(req.GetRequests()) > identityapi.MaxMintBatch
		for _, item := range req.GetRequests() {
			malformed = malformed || proto.Size(item) > maxMintRequestSize
		}

		resp, err := is.MintJWTSVIDs(ctx, &req)
		mu.Lock()
		subjects := signed
		mu.Unlock()
		if malformed || !authenticated {
			require.Error(t, err)
			assert.Nil(t, resp)
			assert.NotEqual(t, codes.OK, status.Code(err))
			assert.Empty(t, subjects, "nothing signed for a batch refused")
			return
		}
		require.NoError(t, err)
		require.Len(t, resp.GetResults(), len(req.GetRequests()))
		mayHave := func(s spiffeid.ID) bool { return s == caller.ID || (caller.ID == agent && s == web) }
		for _, s := range subjects {
			assert.True(t, mayHave(s), "signed for %s, caller %s", s, caller.ID)
		}
		minted := 0
		for i, r := range resp.GetResults() {
			item := req.GetRequests()[i]
			if r.GetSvid() == nil {
				assert.NotZero(t, r.GetCode(), "item %d: no token, no code", i)
				assert.NotEmpty(t, r.GetMessage(), "item %d", i)
				continue
			}
			minted++
			assert.Zero(t, r.GetCode(), "item %d", i)
			want := caller.ID
			if v := item.GetImpersonatedIdentity(); v != "" {
				require.Equal(t, agent, caller.ID, "item %d: only the agent acts for another", i)
				want = web
			}
			assert.Equal(t, want.String(), r.GetSvid().GetSpiffeId(), "item %d", i)
			assert.Equal(t, "token-of."+want.String(), r.GetSvid().GetToken(), "item %d", i)
			_, _, ref := checkMintRequest(item)
			assert.Nil(t, ref, "item %d minted though invalid", i)
		}
		assert.Len(t, subjects, minted, "a token for each signing")
	})
}

// impersonatorFunc adapts a function to Impersonator.
type impersonatorFunc func(ctx context.Context, caller authn.Identity, target spiffeid.ID) error

func (f impersonatorFunc) AuthorizeImpersonation(ctx context.Context, caller authn.Identity, target spiffeid.ID) error {
	return f(ctx, caller, target)
}
