package certservice_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// fakeTaints is a TaintSource whose set the test replaces.
type fakeTaints struct {
	mu sync.Mutex
	ts []certservice.Tainted
	ch chan struct{}
}

func newFakeTaints(ts ...certservice.Tainted) *fakeTaints {
	return &fakeTaints{ts: ts, ch: make(chan struct{})}
}

func (f *fakeTaints) Tainted() ([]certservice.Tainted, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ts, f.ch
}

func (f *fakeTaints) set(ts ...certservice.Tainted) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ts = ts
	close(f.ch)
	f.ch = make(chan struct{})
}

// x509Taint is a tainted X.509 authority whose DER is der.
func x509Taint(skid byte, der string) certservice.Tainted {
	sum := sha256.Sum256([]byte(der))
	return certservice.Tainted{X509SubjectKeyID: []byte{skid, 0xAB}, X509SHA256: hex.EncodeToString(sum[:]), At: time.Unix(1700000000, 0)}
}

func wireTaint(t certservice.Tainted) *identityapi.TaintedAuthority {
	return &identityapi.TaintedAuthority{X509SubjectKeyId: hex.EncodeToString(t.X509SubjectKeyID), X509Sha256: t.X509SHA256,
		JwtKeyId: t.JWTKeyID, TaintedAtUnix: t.At.Unix()}
}

func assertTaints(t *testing.T, want []*identityapi.TaintedAuthority, got []*identityapi.TaintedAuthority) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		assert.Equal(t, want[i].String(), got[i].String(), "tainted authority %d", i)
	}
}

// A stream names the tainted authorities, sorted (X.509 by SHA-256, then
// JWT keys by kid) with the spread, and a change of the set alone wakes
// it: the agents re-issue within the spread, not at their next renewal.
func TestWatchBundlesSendsTaints(t *testing.T) {
	a, b := x509Taint(1, "a"), x509Taint(2, "b")
	jwt := certservice.Tainted{JWTKeyID: "kid-1", At: time.Unix(1700000100, 0)}
	taints := newFakeTaints(jwt, b, a)
	w := newWatchFixture(t, func(cfg *certservice.Config) {
		cfg.Taints = taints
		cfg.ReissueSpread = 90 * time.Second
	})
	stream := w.watch(t, w.identityClient(t, svid(t, w.authority, workloadID), ""))
	msg, err := stream.Recv()
	require.NoError(t, err)
	first, second := wireTaint(a), wireTaint(b)
	if first.X509Sha256 > second.X509Sha256 {
		first, second = second, first
	}
	assertTaints(t, []*identityapi.TaintedAuthority{first, second, wireTaint(jwt)}, msg.GetTaintedAuthorities())
	assert.EqualValues(t, 90, msg.GetReissueSpreadSeconds())

	taints.set(a)
	msg, err = stream.Recv()
	require.NoError(t, err)
	assertTaints(t, []*identityapi.TaintedAuthority{wireTaint(a)}, msg.GetTaintedAuthorities())

	// The same set again sends nothing; clearing it does.
	taints.set(a)
	taints.set()
	msg, err = stream.Recv()
	require.NoError(t, err)
	assert.Empty(t, msg.GetTaintedAuthorities())
	assert.Zero(t, msg.GetReissueSpreadSeconds(), "no spread without taints")
	require.Eventually(t, func() bool { return testutil.ToFloat64(w.svc.WatchMessagesForTest()) >= 3 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, 3.0, testutil.ToFloat64(w.svc.WatchMessagesForTest()), "an unchanged set repeats no message")
}

// The source is not trusted blindly: malformed entries are left out,
// duplicates sent once, and no more than MaxTaintedAuthorities.
func TestWatchBundlesBoundsTaints(t *testing.T) {
	ts := []certservice.Tainted{
		{X509SHA256: "00"}, // no SubjectKeyId
		{X509SubjectKeyID: []byte{1}, X509SHA256: "zz"}, // not hex
		{X509SubjectKeyID: []byte{1}, JWTKeyID: "both"},
		{},
		{JWTKeyID: "dup"}, {JWTKeyID: "dup"},
	}
	for i := range certservice.MaxTaintedAuthorities + 5 {
		ts = append(ts, x509Taint(byte(i), fmt.Sprint(i)))
	}
	w := newWatchFixture(t, func(cfg *certservice.Config) { cfg.Taints = newFakeTaints(ts...) })
	msg, err := w.watch(t, w.identityClient(t, svid(t, w.authority, workloadID), "")).Recv()
	require.NoError(t, err)
	got := msg.GetTaintedAuthorities()
	require.Len(t, got, certservice.MaxTaintedAuthorities)
	for _, ta := range got {
		assert.NotEqual(t, "both", ta.GetJwtKeyId())
		assert.Len(t, ta.GetX509Sha256(), 64)
	}
	assert.EqualValues(t, certservice.DefaultReissueSpread/time.Second, msg.GetReissueSpreadSeconds())
}

// Callers of another trust domain than the CA's get no taints: the
// CA's authorities signed nothing of theirs.
func TestWatchBundlesTaintsOnlyForOwnTrustDomain(t *testing.T) {
	w := newWatchFixture(t, func(cfg *certservice.Config) {
		cfg.Taints = newFakeTaints(x509Taint(1, "a"))
		cfg.TrustDomain = spiffeid.RequireTrustDomainFromString("elsewhere.example")
	})
	msg, err := w.watch(t, w.identityClient(t, svid(t, w.authority, workloadID), "")).Recv()
	require.NoError(t, err)
	assert.Empty(t, msg.GetTaintedAuthorities())
}

func TestNewRefusesNegativeReissueSpread(t *testing.T) {
	_, err := certservice.New(certservice.Config{Signer: &countingSigner{}, Authenticator: fakeTokens, ReissueSpread: -time.Second})
	assert.ErrorContains(t, err, "re-issue spread -1s is negative")
}
