package certservice_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	spiffejwt "github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// caJWTFixture is jwtFixture signing with the fixture's real CA, whose
// published bundle validates the tokens (caJWTBundle).
func caJWTFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.JWT = a
		cfg.Authenticator = authn.Chain{authn.NewX509SVID(td, localRoots{a}, nil), fakeTokens}
	})
}

// caJWTBundle is the JWT bundle the fixture's CA publishes.
func caJWTBundle(f *fixture) *jwtbundle.Bundle {
	return jwtbundle.FromJWTAuthorities(td, f.authority.Bundle().JWTAuthorities())
}

func mintItem(ttl int64, aud ...string) *identityapi.MintJWTSVIDRequest {
	return &identityapi.MintJWTSVIDRequest{Audience: aud, TtlSeconds: ttl}
}

func actFor(target string, aud ...string) *identityapi.MintJWTSVIDRequest {
	return &identityapi.MintJWTSVIDRequest{Audience: aud, ImpersonatedIdentity: target}
}

// mintBatch calls MintJWTSVIDs; a batch that is answered has a result for
// every item.
func mintBatch(t *testing.T, c identityapi.IdentityServiceClient, items ...*identityapi.MintJWTSVIDRequest) ([]*identityapi.MintJWTSVIDResult, error) {
	t.Helper()
	resp, err := c.MintJWTSVIDs(t.Context(), &identityapi.MintJWTSVIDsRequest{Requests: items})
	if err != nil {
		assert.Nil(t, resp)
		return nil, err
	}
	require.Len(t, resp.GetResults(), len(items), "one result an item")
	return resp.GetResults(), nil
}

// assertMinted checks that result is a token for subject and aud that
// validates with go-spiffe against bundle, and returns it.
func assertMinted(t *testing.T, bundle jwtbundle.Source, result *identityapi.MintJWTSVIDResult, subject spiffeid.ID, aud ...string) *spiffejwt.SVID {
	t.Helper()
	require.NotNil(t, result.GetSvid(), "minted, not refused: %d %s", result.GetCode(), result.GetMessage())
	assert.Zero(t, result.GetCode())
	assert.Empty(t, result.GetMessage())
	got, err := spiffejwt.ParseAndValidate(result.GetSvid().GetToken(), bundle, aud[:1])
	require.NoError(t, err)
	assert.Equal(t, subject, got.ID)
	assert.Equal(t, aud, got.Audience)
	assert.Equal(t, subject.String(), result.GetSvid().GetSpiffeId())
	assert.Equal(t, got.Expiry.Unix(), result.GetSvid().GetExpiresAt())
	return got
}

// assertRefusedAsAlone checks that result refuses item with code, its
// message holding msg, and exactly as MintJWTSVID refuses item alone.
func assertRefusedAsAlone(t *testing.T, c identityapi.IdentityServiceClient, item *identityapi.MintJWTSVIDRequest, result *identityapi.MintJWTSVIDResult, code codes.Code, msg string) {
	t.Helper()
	assert.Nil(t, result.GetSvid())
	assert.Equal(t, int32(code), result.GetCode(), result.GetMessage())
	assert.Contains(t, result.GetMessage(), msg)
	_, err := c.MintJWTSVID(t.Context(), item)
	require.Error(t, err)
	assert.Equal(t, status.Code(err), codes.Code(result.GetCode()), "as MintJWTSVID")
	assert.Equal(t, status.Convert(err).Message(), result.GetMessage(), "as MintJWTSVID")
}

// logRecords are the fixture's log lines whose msg is msg.
func logRecords(t *testing.T, f *fixture, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(f.logs.String()) {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// A batch's valid items are minted for the caller, in request order, and
// its invalid ones refused each as MintJWTSVID refuses them, while the
// others are still minted.
func TestMintJWTSVIDsMixedBatch(t *testing.T) {
	f := caJWTFixture(t)
	bundle := caJWTBundle(f)
	for _, tc := range []struct {
		name string
		c    identityapi.IdentityServiceClient
		want spiffeid.ID
	}{
		{"x509-svid", f.identityClient(t, svid(t, f.authority, workloadID), ""), workloadID},
		{"token", f.identityClient(t, nil, goodToken), tokenID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items := []*identityapi.MintJWTSVIDRequest{
				mintItem(120, "https://api.example.com", "other"),
				mintItem(0),
				mintItem(0, "db"),
				mintItem(-1, "a"),
				mintItem(0, "a", "b\x00c"),
				mintItem(60, "cache"),
				mintItem(0, "https://api.example\nforged"),
			}
			results, err := mintBatch(t, tc.c, items...)
			require.NoError(t, err)
			// Each minted item with its own lifetime.
			for i, ttl := range map[int]time.Duration{0: 2 * time.Minute, 2: 5 * time.Minute, 5: time.Minute} {
				aud := items[i].GetAudience()
				got := assertMinted(t, bundle, results[i], tc.want, aud...)
				iat, ok := got.Claims["iat"].(float64)
				require.True(t, ok, "item %d has an iat", i)
				assert.Equal(t, ttl, got.Expiry.Sub(time.Unix(int64(iat), 0)), "item %d", i)
			}
			assertRefusedAsAlone(t, tc.c, items[1], results[1], codes.InvalidArgument, "audience is required")
			assertRefusedAsAlone(t, tc.c, items[3], results[3], codes.InvalidArgument, "ttl_seconds -1 is negative")
			assertRefusedAsAlone(t, tc.c, items[4], results[4], codes.InvalidArgument, "audience 2 holds a control character")
			assertRefusedAsAlone(t, tc.c, items[6], results[6], codes.InvalidArgument, "audience 1 holds a control character")
		})
	}
}

// A batch refused as a whole is refused before anything is signed, and
// every token it asked for is counted by the refusal's code (one for a
// batch malformed by its length: no caller adds thousands with one call).
func TestMintJWTSVIDsBatchRefusals(t *testing.T) {
	n := func(k int) []*identityapi.MintJWTSVIDRequest {
		items := make([]*identityapi.MintJWTSVIDRequest, k)
		for i := range items {
			items[i] = mintItem(0, fmt.Sprint("aud-", i))
		}
		return items
	}
	// Items each within MintJWTSVID's bound, together over the batch's.
	full := make([]string, certservice.MaxAudiences)
	for i := range full {
		full[i] = strings.Repeat(string(rune('a'+i)), certservice.MaxAudienceBytes)
	}
	var large []*identityapi.MintJWTSVIDRequest
	for range identityapi.MaxMintBatchBytes/(certservice.MaxAudiences*certservice.MaxAudienceBytes) + 1 {
		large = append(large, mintItem(0, full...))
	}
	oversizedItem := append(n(2), mintItem(0, strings.Repeat("x", certservice.MaxAudiences*(certservice.MaxAudienceBytes+8)+64)), mintItem(0, "z"))

	for _, tc := range []struct {
		name    string
		mutate  func(*certservice.Config)
		token   string
		items   []*identityapi.MintJWTSVIDRequest
		code    codes.Code
		reason  string
		msg     string
		counted int
	}{
		{name: "empty", token: goodToken, code: codes.InvalidArgument, reason: "empty_batch", msg: "send at least one request", counted: 1},
		{name: "65 items", token: goodToken, items: n(identityapi.MaxMintBatch + 1), code: codes.InvalidArgument, reason: "batch_too_long",
			msg: "the batch asks for 65 tokens; at most 64 are allowed", counted: 1},
		{name: "4,000 items", items: n(4000), code: codes.InvalidArgument, reason: "batch_too_long",
			msg: "the batch asks for 4000 tokens; at most 64 are allowed", counted: 1},
		{name: "over 64 KiB", token: goodToken, items: large, code: codes.ResourceExhausted, reason: "too_large", msg: "batch larger than 65536 bytes", counted: len(large)},
		{name: "an item over MintJWTSVID's bound", token: goodToken, items: oversizedItem, code: codes.ResourceExhausted, reason: "too_large", msg: "item 2: request larger than", counted: 4},
		{name: "no JWT signer", token: goodToken, items: n(3), mutate: func(c *certservice.Config) { c.JWT, c.Bundles = nil, staticBundles() },
			code: codes.FailedPrecondition, reason: "not_configured", msg: "does not mint JWT-SVIDs", counted: 3},
		{name: "no credentials", items: n(3), code: codes.Unauthenticated, reason: "unauthenticated", counted: 3},
		{name: "bad token", token: "bad-token-0123456789", items: n(5), code: codes.Unauthenticated, reason: "unauthenticated", counted: 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, signer := jwtFixture(t, tc.mutate)
			c := f.identityClient(t, nil, tc.token)
			_, err := mintBatch(t, c, tc.items...)
			require.Error(t, err)
			assert.Equal(t, tc.code, status.Code(err), status.Convert(err).Message())
			assert.Contains(t, status.Convert(err).Message(), tc.msg)
			_, _, _, calls := signer.last()
			assert.Zero(t, calls, "nothing signed")
			assert.Equal(t, float64(tc.counted), testutil.ToFloat64(f.svc.JWTSVIDsForTest(tc.code.String(), "none")), "every token asked for counted")
			assert.Zero(t, testutil.ToFloat64(f.svc.JWTSVIDsForTest("OK", "fake-token")))
			recs := logRecords(t, f, "jwt-svid batch refused")
			require.Len(t, recs, 1)
			assert.Equal(t, tc.reason, recs[0]["reason"])
			assert.Equal(t, float64(len(tc.items)), recs[0]["items"])
			assert.Empty(t, logRecords(t, f, "jwt-svid request refused"), "no item was decided")
		})
	}
}

// A node agent's batch mints, item by item, for the workloads of its
// node it names and for itself, and refuses each item it may not have
// exactly as MintJWTSVID refuses it; a caller proven by a certificate
// may not act for anyone, but still gets its own tokens.
func TestMintJWTSVIDsImpersonated(t *testing.T) {
	pods := newNodePods(shopWeb)
	f, signer := jwtFixture(t, func(cfg *certservice.Config) {
		cfg.Authenticator = append(cfg.Authenticator.(authn.Chain), nodeAgentTokens)
		cfg.Impersonator = pods
	})
	bundle := signer.bundle(t)
	agent := f.identityClient(t, nil, nodeAgentToken)
	items := []*identityapi.MintJWTSVIDRequest{
		actFor(shopWeb.String(), "db"),
		actFor(shopAPI.String(), "db"),
		actFor("", "self"),
		actFor("spiffe://example.org", "db"),
		actFor("spiffe://other.example/ns/shop/sa/web", "db"),
		actFor(shopWeb.String(), "cache"),
	}
	results, err := mintBatch(t, agent, items...)
	require.NoError(t, err)
	assertMinted(t, bundle, results[0], shopWeb, "db")
	assertMinted(t, bundle, results[2], nodeAgentID, "self")
	assertMinted(t, bundle, results[5], shopWeb, "cache")
	assertRefusedAsAlone(t, agent, items[1], results[1], codes.PermissionDenied, "may not have a JWT-SVID for "+shopAPI.String())
	assertRefusedAsAlone(t, agent, items[3], results[3], codes.InvalidArgument, "impersonated_identity")
	assertRefusedAsAlone(t, agent, items[4], results[4], codes.PermissionDenied, "not of its trust domain example.org")

	t.Run("a certificate", func(t *testing.T) {
		c := f.identityClient(t, svid(t, f.authority, nodeAgentID), "")
		items := []*identityapi.MintJWTSVIDRequest{actFor(shopWeb.String(), "db"), actFor("", "db")}
		results, err := mintBatch(t, c, items...)
		require.NoError(t, err)
		assertRefusedAsAlone(t, c, items[0], results[0], codes.PermissionDenied, "needs a caller authenticated by its own token")
		assertMinted(t, bundle, results[1], nodeAgentID, "db")
	})

	t.Run("node authorizer unavailable", func(t *testing.T) {
		pods.set(shopWeb, true, errors.Join(authn.ErrUnavailable, errors.New("informer not synced")))
		t.Cleanup(func() { pods.set(shopWeb, true, nil) })
		items := []*identityapi.MintJWTSVIDRequest{actFor(shopWeb.String(), "db"), actFor("", "db")}
		results, err := mintBatch(t, agent, items...)
		require.NoError(t, err)
		assertRefusedAsAlone(t, agent, items[0], results[0], codes.Unavailable, "retry later")
		assertMinted(t, bundle, results[1], nodeAgentID, "db")
	})
}

// The signing rate limit charges every item: a batch over the burst has
// its excess items refused as MintJWTSVID is over the limit, the rest
// minted.
func TestMintJWTSVIDsRateLimitedPerItem(t *testing.T) {
	const burst = 3
	clk := clocktesting.NewFakeClock(time.Now())
	f, signer := jwtFixture(t, func(cfg *certservice.Config) {
		cfg.Clock = clk // no token comes back while the test runs
		cfg.RateLimit, cfg.RateBurst = rate.Every(time.Hour), burst
	})
	c := f.identityClient(t, nil, goodToken)
	items := make([]*identityapi.MintJWTSVIDRequest, burst+4)
	for i := range items {
		items[i] = mintItem(0, fmt.Sprint("aud-", i))
	}
	results, err := mintBatch(t, c, items...)
	require.NoError(t, err, "not the whole batch")
	var minted, limited []int
	for i, r := range results {
		if r.GetSvid() != nil {
			assertMinted(t, signer.bundle(t), r, tokenID, fmt.Sprint("aud-", i))
			minted = append(minted, i)
			continue
		}
		assertRefusedAsAlone(t, c, items[i], r, codes.ResourceExhausted, "rate limit of")
		limited = append(limited, i)
	}
	assert.Len(t, minted, burst, "the burst: %v", minted)
	assert.Len(t, limited, len(items)-burst)
	_, _, _, calls := signer.last()
	assert.Equal(t, burst, calls, "only the burst signed")
	assert.Equal(t, float64(burst), testutil.ToFloat64(f.svc.JWTSVIDsForTest("OK", "fake-token")))
	// The batch's refusals and those of MintJWTSVID alone, one an item.
	assert.Equal(t, float64(2*len(limited)), testutil.ToFloat64(f.svc.JWTSVIDsForTest("ResourceExhausted", "fake-token")))
	for _, rec := range logRecords(t, f, "jwt-svid request refused") {
		assert.Equal(t, "rate_limited", rec["reason"])
	}
}

// Each item is counted by its own code and method, and each refused
// item's log line names its index.
func TestMintJWTSVIDsCountedPerItem(t *testing.T) {
	f, signer := jwtFixture(t, func(cfg *certservice.Config) {
		cfg.Authenticator = append(cfg.Authenticator.(authn.Chain), nodeAgentTokens)
		cfg.Impersonator = newNodePods(shopWeb)
	})
	results, err := mintBatch(t, f.identityClient(t, nil, nodeAgentToken),
		actFor("", "a"),
		mintItem(-5, "a"),
		actFor(shopWeb.String(), "b"),
		actFor(shopAPI.String(), "b"),
		mintItem(0),
		actFor("", "c"),
	)
	require.NoError(t, err)
	var codesGot []codes.Code
	for _, r := range results {
		codesGot = append(codesGot, codes.Code(r.GetCode()))
	}
	assert.Equal(t, []codes.Code{codes.OK, codes.InvalidArgument, codes.OK, codes.PermissionDenied, codes.InvalidArgument, codes.OK}, codesGot)
	_, _, _, calls := signer.last()
	assert.Equal(t, 3, calls)
	m := authn.MethodKubernetesJWT
	assert.Equal(t, 3.0, testutil.ToFloat64(f.svc.JWTSVIDsForTest("OK", m)))
	assert.Equal(t, 2.0, testutil.ToFloat64(f.svc.JWTSVIDsForTest("InvalidArgument", m)))
	assert.Equal(t, 1.0, testutil.ToFloat64(f.svc.JWTSVIDsForTest("PermissionDenied", m)))

	refused := map[float64]string{}
	for _, rec := range logRecords(t, f, "jwt-svid request refused") {
		item, ok := rec["item"].(float64)
		require.True(t, ok, "the line names its item: %v", rec)
		refused[item] = rec["reason"].(string)
		assert.Equal(t, nodeAgentID.String(), rec["spiffe_id"])
	}
	assert.Equal(t, map[float64]string{1: "invalid_ttl", 3: "impersonation", 4: "invalid_audience"}, refused)
	assert.Len(t, logRecords(t, f, "jwt-svid issued"), 3)
}

// A full batch is signed whole (run with -race): 64 distinct tokens, each
// for its own item, in order.
func TestMintJWTSVIDsFullBatch(t *testing.T) {
	f := caJWTFixture(t)
	bundle := caJWTBundle(f)
	items := make([]*identityapi.MintJWTSVIDRequest, identityapi.MaxMintBatch)
	for i := range items {
		items[i] = mintItem(int64(60+i), fmt.Sprint("aud-", i))
	}
	c := f.identityClient(t, nil, goodToken)
	results, err := mintBatch(t, c, items...)
	require.NoError(t, err)
	seen := map[string]int{}
	for i, r := range results {
		tok := assertMinted(t, bundle, r, tokenID, fmt.Sprint("aud-", i)).Marshal()
		if j, dup := seen[tok]; dup {
			t.Errorf("items %d and %d have the same token", j, i)
		}
		seen[tok] = i
	}
	assert.Len(t, seen, identityapi.MaxMintBatch)
	assert.Equal(t, float64(identityapi.MaxMintBatch), testutil.ToFloat64(f.svc.JWTSVIDsForTest("OK", "fake-token")))
}

// A batch's item waits for a signing slot with the queue places of the
// whole batch, which the call holds while it waits: a batch of many small
// items does not hold 58 KiB on one place of the queue (its memory bound).
// With one request waiting in a queue of 10 places, no item of a batch of
// 15 places' worth may wait.
func TestMintJWTSVIDsWaitWithTheBatchsPlaces(t *testing.T) {
	f, signer, queued, release, certDone := heldSlot(t, 10)
	c := f.identityClient(t, nil, goodToken)
	oneDone := make(chan error, 1)
	go func() {
		_, err := c.MintJWTSVID(context.Background(), mintItem(0, "one"))
		oneDone <- err
	}()
	<-queued // one place of ten taken

	items := make([]*identityapi.MintJWTSVIDRequest, 60)
	for i := range items {
		items[i] = mintItem(0, strings.Repeat("a", 480), fmt.Sprint(strings.Repeat("b", 470), i))
	}
	size := proto.Size(&identityapi.MintJWTSVIDsRequest{Requests: items})
	require.Greater(t, size, 14*4<<10, "the batch needs more places than the queue has left")
	batchDone := mintBatchInBackground(c, items)
	var got batchAnswer
	select {
	case got = <-batchDone:
	case <-queued:
		t.Error("an item of a 58 KiB batch waited in a queue with 9 places left")
		close(release)
		<-batchDone
		require.NoError(t, <-certDone)
		require.NoError(t, <-oneDone)
		return
	}
	require.NoError(t, got.err)
	require.Len(t, got.resp.GetResults(), len(items))
	for i, r := range got.resp.GetResults() {
		assert.Equal(t, int32(codes.ResourceExhausted), r.GetCode(), "item %d", i)
		assert.Contains(t, r.GetMessage(), "signing queue full", "item %d", i)
	}
	close(release)
	require.NoError(t, <-certDone)
	require.NoError(t, <-oneDone, "the request waiting is served")
	_, _, _, calls := signer.last()
	assert.Equal(t, 1, calls, "no item of the batch reached the signer")
}

// A batch waits in the signing queue once, as one request, not once per
// token: behind a busy slot a batch of 16 is one queue entry, and once the
// slot frees all 16 are minted in it. (Its tokens waiting one after
// another would make a batch wait 16 queue waits, past a client's
// deadline in a burst.)
func TestMintJWTSVIDsWaitOnceInTheQueue(t *testing.T) {
	f, signer, queued, release, certDone := heldSlot(t, 100)

	items := make([]*identityapi.MintJWTSVIDRequest, 16)
	for i := range items {
		items[i] = mintItem(0, fmt.Sprint("aud-", i))
	}
	c := f.identityClient(t, nil, goodToken)
	batchDone := mintBatchInBackground(c, items)
	<-queued // the batch waits
	close(release)
	require.NoError(t, <-certDone)
	got := <-batchDone
	require.NoError(t, got.err)
	require.Len(t, got.resp.GetResults(), len(items))
	for i, r := range got.resp.GetResults() {
		require.NotNil(t, r.GetSvid(), "item %d: %s", i, r.GetMessage())
	}
	assert.Empty(t, queued, "the batch queued once, not once per token")
	_, _, _, calls := signer.last()
	assert.Equal(t, len(items), calls)
}

// heldSlot is a fixture minting JWT-SVIDs (signer) with one signing slot
// and a queue of queueSize places, the slot taken by a certificate
// request (certDone) whose signing waits until release is closed; queued
// receives each request that starts to wait.
func heldSlot(t *testing.T, queueSize int) (f *fixture, signer *fakeJWTSigner, queued chan struct{}, release chan struct{}, certDone <-chan error) {
	t.Helper()
	entered := make(chan struct{}, 1)
	release = make(chan struct{})
	signer = newFakeJWTSigner(t)
	f = newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.JWT = signer
		cfg.Authenticator = authn.Chain{authn.NewX509SVID(td, localRoots{a}, nil), fakeTokens}
		cfg.Concurrency, cfg.QueueSize = 1, queueSize
		cfg.Signer = heldSigner(a, entered, release)
	})
	queued = make(chan struct{}, identityapi.MaxMintBatch+2)
	f.svc.OnQueuedForTest(func() { queued <- struct{}{} })
	certDone = createInBackground(t, f.client(t, svid(t, f.authority, workloadID), ""))
	<-entered // the one slot is taken
	return f, signer, queued, release, certDone
}

// A caller that leaves while its batch is being signed gets no more of
// it signed: the signer, held on the first token, is not called for the
// rest once the call's context has ended.
func TestMintJWTSVIDsStopsWhenTheCallerLeaves(t *testing.T) {
	signer := newFakeJWTSigner(t)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	serverCtx := make(chan context.Context, 1)
	f := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.JWT = certservice.JWTSignerFunc(func(id spiffeid.ID, audience []string, ttl time.Duration) (string, time.Time, error) {
			once.Do(func() { entered <- struct{}{}; <-release })
			return signer.SignJWT(id, audience, ttl)
		})
		cfg.Authenticator = authn.Chain{authn.NewX509SVID(td, localRoots{a}, nil), fakeTokens}
	}, grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		serverCtx <- ctx
		return handler(ctx, req)
	}))
	items := make([]*identityapi.MintJWTSVIDRequest, 8)
	for i := range items {
		items[i] = mintItem(0, fmt.Sprint("aud-", i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := f.identityClient(t, nil, goodToken).MintJWTSVIDs(ctx, &identityapi.MintJWTSVIDsRequest{Requests: items})
		done <- err
	}()
	sctx := <-serverCtx
	<-entered // the first token is being signed
	cancel()
	require.Equal(t, codes.Canceled, status.Code(<-done))
	<-sctx.Done() // the server knows the caller left
	close(release)
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(f.svc.JWTSVIDsForTest(codes.Canceled.String(), "fake-token")) == float64(len(items)-1)
	}, time.Minute, time.Millisecond, "the 7 tokens after the first refused as the caller left")
	_, _, _, calls := signer.last()
	assert.Equal(t, 1, calls, "no token signed after the caller left")
}

// batchAnswer is a MintJWTSVIDs call's outcome.
type batchAnswer struct {
	resp *identityapi.MintJWTSVIDsResponse
	err  error
}

// mintBatchInBackground makes a MintJWTSVIDs call of items on c and
// sends its outcome.
func mintBatchInBackground(c identityapi.IdentityServiceClient, items []*identityapi.MintJWTSVIDRequest) <-chan batchAnswer {
	done := make(chan batchAnswer, 1)
	go func() {
		resp, err := c.MintJWTSVIDs(context.Background(), &identityapi.MintJWTSVIDsRequest{Requests: items})
		done <- batchAnswer{resp, err}
	}()
	return done
}
