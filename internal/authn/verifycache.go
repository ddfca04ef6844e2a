package authn

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"k8s.io/utils/lru"
)

// DefaultVerifyCacheSize bounds the verified client chains X509SVID
// remembers: one per client on a warm connection, a few hundred bytes each.
const DefaultVerifyCacheSize = 8192

// verifyKey names one successful verification: the chain exactly as
// presented, against one published bundle. A new bundle pointer, as a
// source hands out when the roots change, never matches an old entry.
type verifyKey struct {
	chain  [sha256.Size]byte
	bundle *x509bundle.Bundle
}

// chainDigest hashes every presented certificate, each prefixed with its
// length so that no two different chains hash the same input: a leaf sent
// with other intermediates, or without them, is another chain.
func chainDigest(certs []*x509.Certificate) [sha256.Size]byte {
	h := sha256.New()
	var n [8]byte
	for _, c := range certs {
		binary.BigEndian.PutUint64(n[:], uint64(len(c.Raw)))
		h.Write(n[:])
		h.Write(c.Raw)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// verifiedEntry is what a verification proved: the chain is good at any
// time within [notBefore, notAfter] while anchor is one of the bundle's
// authorities, and issuer signed its leaf; and the grant the leaf records
// (GrantFromCert), read once rather than on every call of a connection. Only facts about the chain are
// kept: whether issuer is the server's own is asked again on every hit
// (WithOwnIssuers), as the server's signing certificates rotate without
// the bundle changing.
type verifiedEntry struct {
	anchor    *x509.Certificate
	issuer    *x509.Certificate
	notBefore time.Time
	notAfter  time.Time
	grant     leafGrant
}

// leafGrant is what GrantFromCert read from a verified leaf.
type leafGrant struct {
	grant Grant
	err   error
}

func readLeafGrant(leaf *x509.Certificate) leafGrant {
	g, err := GrantFromCert(leaf)
	return leafGrant{grant: g, err: err}
}

// verifyCache is a bounded LRU (k8s.io/utils/lru) of successful chain
// verifications. Safe for concurrent use; verification itself happens
// outside it.
type verifyCache struct {
	max int
	lru *lru.Cache // verifyKey → *verifiedEntry
}

func newVerifyCache(max int) *verifyCache {
	if max <= 0 {
		return nil
	}
	return &verifyCache{max: max, lru: lru.New(max)}
}

// hit reports whether key was verified against bundle and is still good
// at now, and the issuer of its leaf and the grant it records. The anchor is looked up in the
// bundle again, so that a bundle changed in place, against the source's
// contract, fails closed rather than trusting a root it no longer holds.
func (c *verifyCache) hit(key verifyKey, bundle *x509bundle.Bundle, now time.Time) (issuer *x509.Certificate, grant leafGrant, ok bool) {
	if c == nil {
		return nil, leafGrant{}, false
	}
	v, ok := c.lru.Get(key)
	if !ok {
		return nil, leafGrant{}, false
	}
	e := v.(*verifiedEntry)
	if now.Before(e.notBefore) || now.After(e.notAfter) {
		c.lru.Remove(key)
		return nil, leafGrant{}, false
	}
	if !bundle.HasX509Authority(e.anchor) {
		return nil, leafGrant{}, false
	}
	return e.issuer, e.grant, true
}

// add remembers a verification whose chains svidcheck.Verify returned. The
// first chain alone bounds the entry: while all its certificates are
// within their validity, verification would find it again.
func (c *verifyCache) add(key verifyKey, chains [][]*x509.Certificate, grant leafGrant) {
	if c == nil || len(chains) == 0 || len(chains[0]) == 0 {
		return
	}
	chain := chains[0]
	e := &verifiedEntry{anchor: chain[len(chain)-1], issuer: leafIssuer(chains), notBefore: chain[0].NotBefore, notAfter: chain[0].NotAfter, grant: grant}
	for _, cert := range chain[1:] {
		if cert.NotBefore.After(e.notBefore) {
			e.notBefore = cert.NotBefore
		}
		if cert.NotAfter.Before(e.notAfter) {
			e.notAfter = cert.NotAfter
		}
	}
	c.lru.Add(key, e)
}

func (c *verifyCache) len() int {
	if c == nil {
		return 0
	}
	return c.lru.Len()
}

// Failure cache defaults. A failed chain is replayed by an attacker at no
// cost to itself; remembering the failure makes each replay a map lookup.
// The TTL is short because a few failures are not the chain's fault for
// good: a certificate that is not valid yet (clock skew at issuance)
// becomes valid, and new roots arrive as a new bundle pointer, which never
// matches an old entry.
const (
	DefaultFailureCacheSize = 4096
	DefaultFailureCacheTTL  = 30 * time.Second
)

// failedEntry is one failed verification at time at, reused until
// expires. Before at (a clock set back) it is not reused: a verification
// that failed on time grounds may pass at another time.
type failedEntry struct {
	err     error
	at      time.Time
	expires time.Time
}

// failureCache is a bounded LRU (k8s.io/utils/lru) of failed chain
// verifications, keyed like verifyCache by the chain as presented and the
// bundle pointer it failed against. It is separate from verifyCache so
// that a flood of distinct bad chains evicts only other failures, never a
// legitimate caller's success. Safe for concurrent use.
type failureCache struct {
	ttl time.Duration
	lru *lru.Cache // verifyKey → *failedEntry
}

func newFailureCache(max int, ttl time.Duration) *failureCache {
	if max <= 0 || ttl <= 0 {
		return nil
	}
	return &failureCache{ttl: ttl, lru: lru.New(max)}
}

// get returns the error key failed with, if that is still remembered at
// now.
func (c *failureCache) get(key verifyKey, now time.Time) (error, bool) {
	if c == nil {
		return nil, false
	}
	v, ok := c.lru.Get(key)
	if !ok {
		return nil, false
	}
	e := v.(*failedEntry)
	if now.Before(e.at) || !now.Before(e.expires) {
		c.lru.Remove(key)
		return nil, false
	}
	return e.err, true
}

// add remembers that key failed with err, for the cache's TTL from now.
func (c *failureCache) add(key verifyKey, err error, now time.Time) {
	if c == nil {
		return
	}
	c.lru.Add(key, &failedEntry{err: err, at: now, expires: now.Add(c.ttl)})
}

func (c *failureCache) len() int {
	if c == nil {
		return 0
	}
	return c.lru.Len()
}
