package server

import (
	"crypto/x509"
	"encoding/hex"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
)

var ledgerT0 = time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)

// ledgerLeaf is enough of a certificate for the ledger: serial, SPIFFE
// ID, issuer and expiry.
func ledgerLeaf(serial int64, id string, akid byte, notAfter time.Time) *x509.Certificate {
	u, _ := url.Parse(id)
	return &x509.Certificate{SerialNumber: big.NewInt(serial), URIs: []*url.URL{u}, AuthorityKeyId: []byte{akid}, NotAfter: notAfter}
}

func TestIssuanceLedgerCountsWhatIsInUse(t *testing.T) {
	clk := clocktesting.NewFakeClock(ledgerT0)
	l := newIssuanceLedger(clk, clk.Now())
	agent := authn.Identity{ID: spiffeid.RequireFromString("spiffe://example.org/agent"), Method: authn.MethodBootstrapToken}
	exp := ledgerT0.Add(time.Hour)

	first := ledgerLeaf(1, "spiffe://example.org/agent", 0xaa, exp)
	l.recordX509(certservice.IssuedCertificate{Leaf: first, Caller: agent})
	// A renewal authenticated by the first certificate replaces it.
	renewer := authn.Identity{ID: agent.ID, Method: authn.MethodX509SVID}
	l.recordX509(certservice.IssuedCertificate{Leaf: ledgerLeaf(2, "spiffe://example.org/agent", 0xbb, exp), Caller: renewer, Presented: first})
	// A node agent asks for two workloads; the second ask for one of them
	// replaces its first.
	node := authn.Identity{ID: spiffeid.RequireFromString("spiffe://example.org/node")}
	l.recordX509(certservice.IssuedCertificate{Leaf: ledgerLeaf(3, "spiffe://example.org/w1", 0xaa, exp), Caller: node})
	l.recordX509(certservice.IssuedCertificate{Leaf: ledgerLeaf(4, "spiffe://example.org/w2", 0xaa, exp.Add(time.Hour)), Caller: node})
	clk.Step(time.Minute)
	l.recordX509(certservice.IssuedCertificate{Leaf: ledgerLeaf(5, "spiffe://example.org/w1", 0xbb, exp), Caller: node})

	counts, since, dropped := l.counts()
	assert.Equal(t, ledgerT0, since)
	assert.Zero(t, dropped)
	aa, bb := "x509:"+hex.EncodeToString([]byte{0xaa}), "x509:"+hex.EncodeToString([]byte{0xbb})
	assert.Equal(t, ledgerCount{Live: 3, InUse: 1, Last: exp.Add(time.Hour)}, counts[aa], "w2 still holds one from aa")
	assert.Equal(t, ledgerCount{Live: 2, InUse: 2, Last: exp}, counts[bb])

	// Expired certificates are forgotten.
	clk.SetTime(exp)
	counts, _, _ = l.counts()
	assert.Equal(t, 1, counts[aa].Live)
	assert.Equal(t, 1, counts[aa].InUse)
	_, ok := counts[bb]
	assert.False(t, ok)
	clk.SetTime(exp.Add(time.Hour))
	counts, _, _ = l.counts()
	assert.Empty(t, counts)
	assert.Empty(t, l.latest, "nothing kept for workloads whose certificates all expired")
}

func TestIssuanceLedgerIsBounded(t *testing.T) {
	clk := clocktesting.NewFakeClock(ledgerT0)
	l := newIssuanceLedger(clk, clk.Now())
	caller := authn.Identity{ID: spiffeid.RequireFromString("spiffe://example.org/node")}
	for i := range maxLedgerEntries + 10 {
		id := "spiffe://example.org/w/" + big.NewInt(int64(i)).Text(36)
		l.recordX509(certservice.IssuedCertificate{Leaf: ledgerLeaf(int64(i+1), id, 0xaa, ledgerT0.Add(time.Hour+time.Duration(i)*time.Millisecond)), Caller: caller})
	}
	counts, _, dropped := l.counts()
	assert.Equal(t, uint64(10), dropped)
	assert.Equal(t, maxLedgerEntries, counts["x509:aa"].Live)
	assert.LessOrEqual(t, len(l.latest), maxLedgerEntries)
}

func TestIssuanceLedgerJWT(t *testing.T) {
	clk := clocktesting.NewFakeClock(ledgerT0)
	l := newIssuanceLedger(clk, clk.Now())
	// A token with kid "k1" (header only matters; the signature is not checked here).
	token := "eyJhbGciOiJFUzI1NiIsImtpZCI6ImsxIn0.e30.c2ln"
	s := l.jwtSigner(certservice.JWTSignerFunc(func(spiffeid.ID, []string, time.Duration) (string, time.Time, error) {
		return token, ledgerT0.Add(5 * time.Minute), nil
	}))
	_, _, err := s.SignJWT(spiffeid.RequireFromString("spiffe://example.org/w"), []string{"a"}, 0)
	require.NoError(t, err)
	counts, _, _ := l.counts()
	assert.Equal(t, ledgerCount{Live: 1, InUse: 1, Last: ledgerT0.Add(5 * time.Minute)}, counts["jwt:k1"])

	// The kid is read once per header: tokens of the same key count under
	// it, a new key's under its own, and an unreadable header is skipped
	// without forgetting the key read last.
	for _, tok := range []string{
		token,
		"eyJhbGciOiJFUzI1NiIsImtpZCI6ImsyIn0.e30.c2ln", // kid "k2"
		"bm90IGpzb24.e30.c2ln",                         // "not json"
		token,
	} {
		l.recordJWT(tok, ledgerT0.Add(time.Minute))
	}
	counts, _, _ = l.counts()
	assert.Equal(t, 3, counts["jwt:k1"].Live)
	assert.Equal(t, 1, counts["jwt:k2"].Live)
	assert.Len(t, counts, 2)
	var nilLedger *issuanceLedger
	assert.Nil(t, nilLedger.issued())
}

// What an operator mints (x509 mint) counts against its authority, in
// use until it expires: no renewal ever tells the ledger it was replaced,
// not even a second mint for the same identity.
func TestIssuanceLedgerCountsMinted(t *testing.T) {
	clk := clocktesting.NewFakeClock(ledgerT0)
	l := newIssuanceLedger(clk, clk.Now())
	exp := ledgerT0.Add(time.Hour)
	l.recordMinted(ledgerLeaf(1, "spiffe://example.org/ops/probe", 0xaa, exp))
	l.recordMinted(ledgerLeaf(2, "spiffe://example.org/ops/probe", 0xaa, exp))
	counts, _, _ := l.counts()
	assert.Equal(t, ledgerCount{Live: 2, InUse: 2, Last: exp}, counts["x509:aa"])
	clk.SetTime(exp)
	counts, _, _ = l.counts()
	assert.Empty(t, counts, "forgotten once expired")
}
