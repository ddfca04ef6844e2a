package server

import (
	"container/heap"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/server/admin"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// maxLedgerEntries bounds the issuance ledger: about 100 bytes each, so
// 10 MB at most, room for 10,000 workloads renewing at half life with
// certificates of a day. Past it the entries expiring first are dropped
// and the counts become lower bounds (ledgerCounts.Dropped says so).
const maxLedgerEntries = 100_000

// issuanceLedger counts, per signing authority, what this replica signed
// that is still valid (live) and, of that, what no newer certificate for
// the same workload replaced (in use): what `ca authority list` shows and
// what `ca authority revoke` waits for after a taint. A certificate
// replaces another when the caller renewed with it (it authenticated
// with the older one), or when the same caller got a newer one for the
// same identity (and pod, when its token named one): a node agent asking
// for several pods of one service account on one node counts once.
// It lives in memory: it counts since this replica started.
type issuanceLedger struct {
	clock clock.PassiveClock
	since time.Time

	mu      sync.Mutex
	entries map[string]*ledgerEntry // by key: X.509 serial, or a JWT sequence number
	latest  map[string]string       // workload → key of its newest certificate
	byExp   ledgerHeap
	jwtSeq  uint64
	dropped uint64
	// jwtHeader and jwtIssuer are the header segment of the last JWT-SVID
	// recorded and its "jwt:<kid>": every token one key signs has the same
	// header, read once rather than per token.
	jwtHeader, jwtIssuer string
}

type ledgerEntry struct {
	key        string
	workload   string // latest's key; "" for JWT-SVIDs
	issuer     string // "x509:<authority key id hex>" or "jwt:<kid>"
	notAfter   time.Time
	superseded bool
	index      int // in byExp
}

// ledgerCount is what one authority signed that is still valid: Last is
// when the last of it expires.
type ledgerCount struct {
	Live, InUse int
	Last        time.Time
}

// newIssuanceLedger counts what is signed from since on: before the CA
// signs anything in this process.
func newIssuanceLedger(clk clock.PassiveClock, since time.Time) *issuanceLedger {
	return &issuanceLedger{clock: clk, since: since, entries: map[string]*ledgerEntry{}, latest: map[string]string{}}
}

// recordX509 is certservice.Config.Issued.
func (l *issuanceLedger) recordX509(rec certservice.IssuedCertificate) {
	leaf := rec.Leaf
	key := "x509:" + leaf.SerialNumber.Text(16)
	id := leafID(leaf)
	workload := rec.Caller.ID.String() + "\x00" + id + "\x00" + string(rec.Caller.Pod.UID)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	l.pruneLocked(now)
	if p := rec.Presented; p != nil && leafID(p) == id {
		l.supersedeLocked("x509:" + p.SerialNumber.Text(16))
	}
	if prev, ok := l.latest[workload]; ok {
		l.supersedeLocked(prev)
	}
	l.latest[workload] = key
	l.addLocked(&ledgerEntry{key: key, workload: workload, issuer: "x509:" + hex.EncodeToString(leaf.AuthorityKeyId), notAfter: leaf.NotAfter})
}

// recordJWT records a JWT-SVID; tokens are not renewed, so each is in use
// until it expires.
func (l *issuanceLedger) recordJWT(token string, exp time.Time) {
	header, _, _ := strings.Cut(token, ".")
	l.mu.Lock()
	defer l.mu.Unlock()
	if header != l.jwtHeader || l.jwtIssuer == "" {
		kid := jwtsvid.KeyID(token)
		if kid == "" {
			return
		}
		l.jwtHeader, l.jwtIssuer = header, "jwt:"+kid
	}
	now := l.clock.Now()
	l.pruneLocked(now)
	l.jwtSeq++
	l.addLocked(&ledgerEntry{key: "jwt#" + strconv.FormatUint(l.jwtSeq, 10), issuer: l.jwtIssuer, notAfter: exp})
}

func (l *issuanceLedger) addLocked(e *ledgerEntry) {
	if old, ok := l.entries[e.key]; ok {
		heap.Remove(&l.byExp, old.index)
	}
	for len(l.byExp) >= maxLedgerEntries {
		l.removeLocked(heap.Pop(&l.byExp).(*ledgerEntry))
		l.dropped++
	}
	l.entries[e.key] = e
	heap.Push(&l.byExp, e)
}

func (l *issuanceLedger) supersedeLocked(key string) {
	if e, ok := l.entries[key]; ok {
		e.superseded = true
	}
}

// pruneLocked forgets what expired.
func (l *issuanceLedger) pruneLocked(now time.Time) {
	for len(l.byExp) > 0 && !l.byExp[0].notAfter.After(now) {
		l.removeLocked(heap.Pop(&l.byExp).(*ledgerEntry))
	}
}

func (l *issuanceLedger) removeLocked(e *ledgerEntry) {
	delete(l.entries, e.key)
	if e.workload != "" && l.latest[e.workload] == e.key {
		delete(l.latest, e.workload)
	}
}

// counts is what each authority signed that is still valid, keyed as
// ledgerEntry.issuer, and since when this replica counts.
func (l *issuanceLedger) counts() (map[string]ledgerCount, time.Time, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pruneLocked(l.clock.Now())
	out := map[string]ledgerCount{}
	for _, e := range l.entries {
		c := out[e.issuer]
		c.Live++
		if !e.superseded {
			c.InUse++
		}
		if e.notAfter.After(c.Last) {
			c.Last = e.notAfter
		}
		out[e.issuer] = c
	}
	return out, l.since, l.dropped
}

func leafID(c *x509.Certificate) string {
	id, err := x509svid.IDFromCert(c)
	if err != nil {
		return ""
	}
	return id.String()
}

// issued is certservice.Config.Issued for l; nil for a nil l.
func (l *issuanceLedger) issued() func(certservice.IssuedCertificate) {
	if l == nil {
		return nil
	}
	return l.recordX509
}

// jwtSigner is next, recording in l what it mints (next for a nil l).
func (l *issuanceLedger) jwtSigner(next certservice.JWTSigner) certservice.JWTSigner {
	if l == nil || next == nil {
		return next
	}
	return ledgerJWTSigner{next: next, ledger: l}
}

// signed is admin.Config.Signed: the counts keyed as the admin API keys
// them, and since when this replica counts.
func (l *issuanceLedger) signed() (map[string]api.SignedCount, time.Time) {
	counts, since, _ := l.counts()
	out := make(map[string]api.SignedCount, len(counts))
	for k, c := range counts {
		out[k] = api.SignedCount{Live: c.Live, InUse: c.InUse, Last: c.Last}
	}
	return out, since
}

// incomplete is admin.Config.SignedIncomplete: a ledger that had to drop
// entries (maxLedgerEntries) counts what it kept.
func (l *issuanceLedger) incomplete() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dropped == 0 {
		return ""
	}
	return fmt.Sprintf("the ledger was full (%d entries) and dropped %d of the soonest-expiring", maxLedgerEntries, l.dropped)
}

// recordMinted records an X509-SVID an operator minted (admin API): in
// use until it expires, as nothing it is renewed with tells this ledger
// it was replaced.
func (l *issuanceLedger) recordMinted(leaf *x509.Certificate) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pruneLocked(l.clock.Now())
	l.addLocked(&ledgerEntry{key: "x509:" + leaf.SerialNumber.Text(16), issuer: "x509:" + hex.EncodeToString(leaf.AuthorityKeyId), notAfter: leaf.NotAfter})
}

// minter is admin.Config.Mint for a, counting in l what operators mint.
func (l *issuanceLedger) minter(a *ca.Authority) admin.Minter {
	return ledgerMinter{JWTSigner: l.jwtSigner(a), authority: a, ledger: l}
}

// ledgerMinter signs with authority and records in ledger what it signs.
type ledgerMinter struct {
	certservice.JWTSigner
	authority *ca.Authority
	ledger    *issuanceLedger
}

func (m ledgerMinter) SignX509SVID(p ca.X509SVIDParams) (*ca.Issued, error) {
	issued, err := m.authority.SignX509SVID(p)
	if err == nil {
		m.ledger.recordMinted(issued.Leaf)
	}
	return issued, err
}

// ledgerJWTSigner records what its signer mints.
type ledgerJWTSigner struct {
	next   certservice.JWTSigner
	ledger *issuanceLedger
}

func (s ledgerJWTSigner) SignJWT(id spiffeid.ID, audience []string, ttl time.Duration) (string, time.Time, error) {
	token, exp, err := s.next.SignJWT(id, audience, ttl)
	if err == nil {
		s.ledger.recordJWT(token, exp)
	}
	return token, exp, err
}

// ledgerHeap orders entries by expiry, soonest first.
type ledgerHeap []*ledgerEntry

func (h ledgerHeap) Len() int           { return len(h) }
func (h ledgerHeap) Less(i, j int) bool { return h[i].notAfter.Before(h[j].notAfter) }
func (h ledgerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *ledgerHeap) Push(x any) {
	e := x.(*ledgerEntry)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *ledgerHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
