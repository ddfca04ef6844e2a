package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// TestX509ChainAttack reproduces issue 14 item 2 against a real server on
// loopback: unauthenticated clients present the expensive chain (seven CAs
// with one subject and RSA-8192 keys with a huge exponent) and chains that
// fail verification, over several connections, while a workload renews
// with its SVID. The expensive chains are refused before any signature
// check, a replayed bad chain is verified once, and every legitimate call
// is served.
func TestX509ChainAttack(t *testing.T) {
	at := startAttackTarget(t, func(o *Config) { o.GRPC.verifyPerPeer, o.GRPC.verifyMax = 2, 4 })
	svid, csr := legitSVID(t, at, "127.0.0.10")
	legit := dialFrom(t, at.grpc, "127.0.0.10", svid)

	const conns, calls = 4, 25
	expensive := expensiveChain(t, spiffeid.RequireFromPath(servertest.LaptopID.TrustDomain(), "/attacker"))
	rogue := rogueSVID(t, spiffeid.RequireFromPath(servertest.LaptopID.TrustDomain(), "/attacker"))
	attackCSR, _ := csrFor(t, spiffeid.RequireFromPath(servertest.LaptopID.TrustDomain(), "/attacker"))
	var codesSeen sync.Map
	var wg sync.WaitGroup
	for i := range conns {
		for _, chain := range []struct {
			name string
			c    *securityv1alpha1.IstioCertificateServiceClient
		}{
			{"expensive", ptr(dialFrom(t, at.grpc, "127.0.0.66", expensive))},
			{"rogue", ptr(dialFrom(t, at.grpc, fmt.Sprintf("127.0.0.%d", 70+i), rogue))},
		} {
			wg.Go(func() {
				for range calls {
					_, err := (*chain.c).CreateCertificate(context.Background(), &securityv1alpha1.IstioCertificateRequest{Csr: attackCSR})
					n, _ := codesSeen.LoadOrStore(chain.name+"/"+status.Code(err).String(), new(atomic.Int64))
					n.(*atomic.Int64).Add(1)
				}
			})
		}
	}
	var served atomic.Int64
	for range 20 {
		resp, err := legit.CreateCertificate(context.Background(), &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
		if assert.NoError(t, err) && assert.NotEmpty(t, resp.GetCertChain()) {
			served.Add(1)
		}
	}
	wg.Wait()
	assert.EqualValues(t, 20, served.Load(), "every legitimate renewal served during the attack")

	count := func(k string) int64 {
		if n, ok := codesSeen.Load(k); ok {
			return n.(*atomic.Int64).Load()
		}
		return 0
	}
	assert.EqualValues(t, conns*calls, count("expensive/"+codes.Unauthenticated.String()), "every expensive chain refused")
	assert.EqualValues(t, conns*calls, count("rogue/"+codes.Unauthenticated.String())+count("rogue/"+codes.Unavailable.String()),
		"rogue chains refused, or turned away while the address had its share in flight")

	outOfBounds := at.metric(t, "trustbridge_authn_x509_verifications_total", `result="out_of_bounds"`)
	failed := at.metric(t, "trustbridge_authn_x509_verifications_total", `result="failed"`)
	failedCached := at.metric(t, "trustbridge_authn_x509_verifications_total", `result="failed_cached"`)
	throttled := at.metric(t, "trustbridge_authn_x509_verifications_total", `result="throttled"`)
	assert.EqualValues(t, conns*calls, outOfBounds, "the expensive chain never reached a signature check")
	assert.LessOrEqual(t, failed, float64(conns), "one rogue chain: verified at most once per connection racing the first")
	assert.EqualValues(t, conns*calls, failed+failedCached+throttled)
	assert.EqualValues(t, count("rogue/"+codes.Unavailable.String()), throttled)
	t.Logf("expensive refused before verification: %v; rogue: %v verified, %v from the failure cache, %v throttled", outOfBounds, failed, failedCached, throttled)
	assert.Zero(t, at.logCount("ERROR", "certificate request refused"), "refusals never log an Error per call")
}

func ptr[T any](v T) *T { return &v }

// TestTokenFloodAttack reproduces issue 14 item 3 against a real server
// and a real kube-apiserver: three addresses flood the certificate
// service with distinct JWT-shaped tokens (random claims, well-formed
// claims with a random signature, an unknown key id) while ten pods, each
// from its own address, ask for their certificates, and a fourth address
// replays thirty genuine tokens of its own service account. The junk never
// reaches TokenReview, every pod is served, the genuine flood gets its
// address's burst and is turned away with Unavailable beyond it, and no
// refusal is logged at Error.
func TestTokenFloodAttack(t *testing.T) {
	k := kubetest.Shared(t)
	ns := k.Namespace(t)
	at := startAttackTarget(t, func(o *Config) {
		o.GRPC.TokenReview, o.GRPC.Kubeconfig = TokenReviewOn, kubeconfigFor(t, k)
		// No refill within the test: the genuine flood gets its burst.
		o.GRPC.reviewPeerRate, o.GRPC.reviewPeerBurst = 0.001, 5
	})
	require.Eventually(t, func() bool { return at.metric(t, "trustbridge_authn_token_issuer_keys") > 0 },
		10*time.Second, 10*time.Millisecond, "the issuer's keys are read at start:\n%s", at.logs.String())

	const pods, attackers, perAttacker, genuine = 10, 3, 200, 30
	podTokens := make([]string, pods)
	for i := range podTokens {
		podTokens[i] = k.ServiceAccountToken(t, ns, fmt.Sprintf("pod-%d", i), []string{"example.org"}, time.Hour)
	}
	genuineTokens := make([]string, genuine)
	for i := range genuineTokens {
		genuineTokens[i] = k.ServiceAccountToken(t, ns, "attacker", []string{"example.org"}, time.Hour)
	}
	attackCSR, _ := csrFor(t, spiffeid.RequireFromPath(servertest.LaptopID.TrustDomain(), "/ns/"+ns+"/sa/attacker"))

	var junkCodes, genuineCodes sync.Map
	tally := func(m *sync.Map, err error) {
		n, _ := m.LoadOrStore(status.Code(err).String(), new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
	}
	var wg sync.WaitGroup
	for a := range attackers {
		c := dialFrom(t, at.grpc, fmt.Sprintf("127.0.0.%d", 80+a), nil)
		for g := range 4 {
			wg.Go(func() {
				for i := range perAttacker / 4 {
					n := (a*4+g)*perAttacker + i
					_, err := c.CreateCertificate(withBearer(context.Background(), junkToken(ns, n, n%3)), &securityv1alpha1.IstioCertificateRequest{Csr: attackCSR})
					tally(&junkCodes, err)
				}
			})
		}
	}
	flood := dialFrom(t, at.grpc, "127.0.0.99", nil)
	for _, tok := range genuineTokens {
		wg.Go(func() {
			_, err := flood.CreateCertificate(withBearer(context.Background(), tok), &securityv1alpha1.IstioCertificateRequest{Csr: attackCSR})
			tally(&genuineCodes, err)
		})
	}
	var served atomic.Int64
	for i, tok := range podTokens {
		wg.Go(func() {
			csr, _ := csrFor(t, spiffeid.RequireFromPath(servertest.LaptopID.TrustDomain(), fmt.Sprintf("/ns/%s/sa/pod-%d", ns, i)))
			c := dialFrom(t, at.grpc, fmt.Sprintf("127.0.1.%d", i+1), nil)
			_, err := c.CreateCertificate(withBearer(context.Background(), tok), &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
			if assert.NoError(t, err, "pod %d", i) {
				served.Add(1)
			}
		})
	}
	wg.Wait()

	load := func(m *sync.Map, code codes.Code) int64 {
		if n, ok := m.Load(code.String()); ok {
			return n.(*atomic.Int64).Load()
		}
		return 0
	}
	assert.EqualValues(t, pods, served.Load(), "every pod served during the flood")
	assert.EqualValues(t, attackers*perAttacker, load(&junkCodes, codes.Unauthenticated), "every junk token refused")
	// The genuine flood's 30 calls start at once on one new connection:
	// beyond pendingStreams they are refused before any work
	// (ResourceExhausted) until one succeeds; of those let through, the
	// address gets its burst of reviews and the rest are turned away.
	okGenuine, busyGenuine, shedGenuine := load(&genuineCodes, codes.OK), load(&genuineCodes, codes.Unavailable), load(&genuineCodes, codes.ResourceExhausted)
	assert.EqualValues(t, genuine, okGenuine+busyGenuine+shedGenuine)
	assert.LessOrEqual(t, okGenuine, int64(5), "one address gets its burst of reviews")

	reviews := 0.0
	for _, r := range []string{"authenticated", "unauthenticated", "refused", "error"} {
		reviews += at.metric(t, "trustbridge_authn_token_reviews_total", `result="`+r+`"`)
	}
	assert.LessOrEqual(t, reviews, float64(pods+5), "junk never reached TokenReview")
	localRefused := at.metric(t, "trustbridge_authn_token_local_checks_total", `result="refused_`)
	assert.EqualValues(t, attackers*perAttacker, localRefused, "junk refused by claims or signature")
	assert.Positive(t, at.metric(t, "trustbridge_authn_token_local_checks_total", `result="refused_signature"`), "checked against the issuer's keys")
	assert.Positive(t, at.metric(t, "trustbridge_authn_token_local_checks_total", `result="refused_unknown_key"`))
	assert.Equal(t, float64(busyGenuine), at.metric(t, "trustbridge_authn_token_reviews_total", `result="peer_`))
	assert.Zero(t, at.logCount("ERROR", "refused"), "no refusal logged at Error")
	warns := at.logCount("WARN", "refused")
	assert.Less(t, warns, attackers*perAttacker/10, "refusal warnings are bounded")
	t.Logf("junk: %d refused locally; genuine flood: %d served, %d turned away, %d shed at the connection; %v TokenReviews; %d refusal warnings",
		attackers*perAttacker, okGenuine, busyGenuine, shedGenuine, reviews, warns)
}
