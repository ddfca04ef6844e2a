package sds

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"slices"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// encoded is one Secret, marshalled once and shared by every stream that
// sends it. Never modify it: gRPC marshals the same *anypb.Any for many
// streams at once.
type encoded struct {
	name    string
	version string
	any     *anypb.Any
	// denied marks the explicit denial of a trust domain.
	denied bool
}

// encodeSecret marshals s deterministically; the version is the first 8
// bytes of the SHA-256 of those bytes, in hex, so it is the same across
// restarts and replicas for the same content.
func encodeSecret(s *tlsv3.Secret) (*encoded, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	return &encoded{
		name:    s.GetName(),
		version: hex.EncodeToString(sum[:8]),
		any:     &anypb.Any{TypeUrl: resourcev3.SecretType, Value: b},
	}, nil
}

func inline(b []byte) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
}

func appendPEM(dst []byte, certs ...*x509.Certificate) []byte {
	for _, c := range certs {
		dst = append(dst, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return dst
}

// certSecret is the tls_certificate Secret of cred, named name.
func certSecret(name string, cred *Credential) (*tlsv3.Secret, error) {
	der, err := x509.MarshalPKCS8PrivateKey(cred.Key)
	if err != nil {
		return nil, fmt.Errorf("encoding the private key: %w", err)
	}
	key := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	clear(der)
	return &tlsv3.Secret{
		Name: name,
		Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inline(appendPEM(nil, cred.Chain...)),
			PrivateKey:       inline(key),
		}},
	}, nil
}

func trustedCASecret(name string, pemBytes []byte) *tlsv3.Secret {
	return &tlsv3.Secret{
		Name: name,
		Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: inline(pemBytes),
		}},
	}
}

// allSecret is ALL for decision d: Envoy's SPIFFE validator configured
// with every trust domain d allows that has roots, or, when plain, one
// trusted_ca with their roots. It returns nil when there are no roots at
// all: Envoy refuses a SPIFFE validator without trust domains.
//
// When a grant among them limits its peers, ALL also carries
// match_typed_subject_alt_names accepting, per trust domain, the granted
// peers, or every member ("spiffe://<td>/") of the local trust domain and
// of unrestricted ones. Envoy's SPIFFE validator honours them: its
// constructor keeps the URI matchers of the validation context and
// verifyCertChainUsingTrustBundleStore requires one to match once the
// chain verified against the leaf's own trust domain's bundle
// (source/extensions/transport_sockets/tls/cert_validator/spiffe/spiffe_validator.cc,
// SPIFFEValidator::SPIFFEValidator and matchSubjectAltName), as the
// default validator does for a plain trusted_ca.
func allSecret(bundles []*x509bundle.Bundle, plain bool, d trustpolicy.Decision) (*tlsv3.Secret, error) {
	allowed, matchers := allowedBundles(bundles, d)
	if len(allowed) == 0 {
		return nil, nil
	}
	var vc *tlsv3.CertificateValidationContext
	if plain {
		vc = &tlsv3.CertificateValidationContext{TrustedCa: inline(plainRoots(allowed))}
	} else {
		cfg := &tlsv3.SPIFFECertValidatorConfig{}
		for _, b := range allowed {
			cfg.TrustDomains = append(cfg.TrustDomains, &tlsv3.SPIFFECertValidatorConfig_TrustDomain{
				Name:        b.TrustDomain().Name(),
				TrustBundle: inline(appendPEM(nil, b.X509Authorities()...)),
			})
		}
		typed, err := anypb.New(cfg)
		if err != nil {
			return nil, err
		}
		vc = &tlsv3.CertificateValidationContext{
			CustomValidatorConfig: &corev3.TypedExtensionConfig{Name: SPIFFEValidatorName, TypedConfig: typed},
		}
	}
	vc.MatchTypedSubjectAltNames = matchers
	return &tlsv3.Secret{Name: AllName, Type: &tlsv3.Secret_ValidationContext{ValidationContext: vc}}, nil
}

// allowedBundles returns the bundles with roots that d allows, sorted by
// trust domain and one per trust domain, and, when any of their grants
// limits its peers, the SAN matchers of them all.
func allowedBundles(bundles []*x509bundle.Bundle, d trustpolicy.Decision) ([]*x509bundle.Bundle, []*tlsv3.SubjectAltNameMatcher) {
	sorted := slices.Clone(bundles)
	slices.SortStableFunc(sorted, func(a, b *x509bundle.Bundle) int {
		return bytes.Compare([]byte(a.TrustDomain().Name()), []byte(b.TrustDomain().Name()))
	})
	var (
		out        []*x509bundle.Bundle
		matchers   []*tlsv3.SubjectAltNameMatcher
		restricted bool
		last       spiffeid.TrustDomain
	)
	for _, b := range sorted {
		if len(b.X509Authorities()) == 0 || b.TrustDomain() == last {
			continue
		}
		last = b.TrustDomain()
		g, ok := d.Allows(last)
		if !ok {
			continue
		}
		out = append(out, b)
		matchers = append(matchers, grantMatchers(last, g)...)
		restricted = restricted || len(g.Peers) > 0
	}
	if !restricted {
		matchers = nil
	}
	return out, matchers
}

// plainRoots is every root of bundles once, in order.
func plainRoots(bundles []*x509bundle.Bundle) []byte {
	var out []byte
	seen := make(map[string]bool)
	for _, b := range bundles {
		for _, c := range b.X509Authorities() {
			if !seen[string(c.Raw)] {
				seen[string(c.Raw)] = true
				out = appendPEM(out, c)
			}
		}
	}
	return out
}

// validationKey names one validation-context resource of one Trust and
// one decision key (decisionKeyFor). The kind keeps ROOTCA as ALL
// (RootCASPIFFE) and ROOTCA as the local roots apart, whatever the name.
type validationKey struct {
	name  string
	kind  nameKind
	plain bool // ALL (or ROOTCA as ALL) as a plain trusted_ca
}

// validationCache holds the validation contexts of the newest Trust, and of
// the one before for streams that have not moved on yet, built lazily,
// once each per decision key. Callers' decisions are as many as their
// identities: the encodings of a decision are kept only while a stream
// holds it (acquire, release), so callers cannot grow the cache beyond
// what their open streams cost anyway.
type validationCache struct {
	onEncode func() // counts encodings
	local    spiffeid.TrustDomain
	now      func() time.Time

	mu        sync.Mutex
	cur, prev *trustEncodings
	// live counts the open sessions holding each decision key.
	live map[string]int
	// denials are the sentinel CAs of denied trust domains, one per trust
	// domain of the current and previous Trust, so that a denial keeps
	// its version across Trust changes.
	denials map[spiffeid.TrustDomain]*x509.Certificate
}

// trustEncodings are the encoded resources of one Trust.
type trustEncodings struct {
	trust   *Trust
	byTD    map[spiffeid.TrustDomain]*x509bundle.Bundle
	entries map[string]map[validationKey]*encoded // decision key → …; nil value: known not to exist
}

func newValidationCache(local spiffeid.TrustDomain, now func() time.Time, onEncode func()) *validationCache {
	return &validationCache{
		onEncode: onEncode,
		local:    local,
		now:      now,
		live:     make(map[string]int),
		denials:  make(map[spiffeid.TrustDomain]*x509.Certificate),
	}
}

func (c *validationCache) of(t *Trust) *trustEncodings {
	switch {
	case c.cur != nil && c.cur.trust == t:
		return c.cur
	case c.prev != nil && c.prev.trust == t:
		return c.prev
	}
	te := &trustEncodings{
		trust:   t,
		byTD:    make(map[spiffeid.TrustDomain]*x509bundle.Bundle, len(t.Bundles)),
		entries: make(map[string]map[validationKey]*encoded),
	}
	for _, b := range t.Bundles {
		if _, dup := te.byTD[b.TrustDomain()]; !dup {
			te.byTD[b.TrustDomain()] = b
		}
	}
	c.prev, c.cur = c.cur, te
	for td := range c.denials {
		if _, ok := te.byTD[td]; !ok && (c.prev == nil || c.prev.byTD[td] == nil) {
			delete(c.denials, td)
		}
	}
	return te
}

// acquire registers a session holding decision key k; release undoes it,
// dropping k's encodings when no session is left.
func (c *validationCache) acquire(k string) {
	if k == anyDecision {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.live[k]++
}

func (c *validationCache) release(k string) {
	if k == anyDecision {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live[k]--; c.live[k] > 0 {
		return
	}
	delete(c.live, k)
	for _, te := range []*trustEncodings{c.cur, c.prev} {
		if te != nil {
			delete(te.entries, k)
		}
	}
}

// get returns the resource named name (parsed as p) of t under decision
// d, nil when it does not exist in t.
func (c *validationCache) get(t *Trust, name string, p parsedName, plain bool, d trustpolicy.Decision) (*encoded, error) {
	if p.kind != kindAll {
		plain = false
	}
	dk := decisionKeyFor(p, d, c.local)
	k := validationKey{name: name, kind: p.kind, plain: plain}
	c.mu.Lock()
	defer c.mu.Unlock()
	te := c.of(t)
	if e, ok := te.entries[dk][k]; ok {
		return e, nil
	}
	e, err := c.build(te, name, p, plain, d, dk)
	if err != nil {
		return nil, err
	}
	// Only names that exist or are known trust domains are remembered, so
	// callers asking for made-up trust domains cannot grow the map; and
	// only for decisions an open stream (or Fetch call) holds.
	keep := dk == anyDecision || dk == deniedDecision || c.live[dk] > 0
	if keep && (e != nil || p.kind != kindTrustDomain) {
		if te.entries[dk] == nil {
			te.entries[dk] = make(map[validationKey]*encoded)
		}
		te.entries[dk][k] = e
	}
	return e, nil
}

// build encodes one resource; dk says whether it is a denial.
func (c *validationCache) build(te *trustEncodings, name string, p parsedName, plain bool, d trustpolicy.Decision, dk string) (*encoded, error) {
	var s *tlsv3.Secret
	switch p.kind {
	case kindTrustDomain:
		b := te.byTD[p.td]
		if dk != deniedDecision {
			if b == nil || len(b.X509Authorities()) == 0 {
				return nil, nil
			}
			g, _ := d.Allows(p.td)
			s = tdSecret(name, b, g)
			break
		}
		// A denial is sent for a trust domain the server knows, with roots
		// or without (a bundle of no keys), and for one a rule governs even
		// while the server holds no bundle of it: silence would leave the
		// roots Envoy had before. Not for made-up names, so a caller cannot
		// make the server mint sentinels at will.
		if b == nil && !d.Governs(p.td) {
			return nil, nil
		}
		sentinel, err := c.sentinel(p.td)
		if err != nil {
			return nil, err
		}
		s = deniedSecret(name, sentinel)
	case kindAll:
		var err error
		if s, err = allSecret(te.trust.Bundles, plain, d); err != nil || s == nil {
			return nil, err
		}
		// ALL, or ROOTCA as ALL: Envoy matches a secret by the name it
		// asked for.
		s.Name = name
	default:
		return nil, nil
	}
	e, err := encodeSecret(s)
	if err != nil {
		return nil, err
	}
	e.denied = dk == deniedDecision
	c.onEncode()
	return e, nil
}

// sentinel returns td's sentinel CA, minting it the first time.
func (c *validationCache) sentinel(td spiffeid.TrustDomain) (*x509.Certificate, error) {
	if cert := c.denials[td]; cert != nil {
		return cert, nil
	}
	cert, err := newSentinelCA(td, c.now())
	if err != nil {
		return nil, err
	}
	c.denials[td] = cert
	return cert, nil
}

// certCache shares the encoded tls_certificate resources of one identity
// among its open streams: one encoding per (Credential, name).
type certCache struct {
	onEncode func()

	mu  sync.Mutex
	ids map[spiffeid.ID]*certEntry
}

type certEntry struct {
	refs int // open streams of the identity

	// cur and prev are the encodings of the newest credential and of the
	// one before, which streams still hold until they refresh.
	mu        sync.Mutex
	cur, prev credEncodings
}

type credEncodings struct {
	cred *Credential
	enc  map[string]*encoded
}

// acquire registers an open stream of id; release undoes it, dropping the
// identity's encodings (with their private keys) when no stream is left.
func (c *certCache) acquire(id spiffeid.ID) *certEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.ids[id]
	if e == nil {
		e = &certEntry{}
		c.ids[id] = e
	}
	e.refs++
	return e
}

func (c *certCache) release(id spiffeid.ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.ids[id]; e != nil {
		if e.refs--; e.refs <= 0 {
			delete(c.ids, id)
		}
	}
}

// get returns the encoding of cred named name, building it at most once
// per credential. A nil entry (Fetch) encodes without caching.
func (c *certCache) get(e *certEntry, cred *Credential, name string) (*encoded, error) {
	if e == nil {
		return c.encode(cred, name)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var ce *credEncodings
	switch cred {
	case e.cur.cred:
		ce = &e.cur
	case e.prev.cred:
		ce = &e.prev
	default:
		e.prev, e.cur = e.cur, credEncodings{cred: cred, enc: make(map[string]*encoded, 2)}
		ce = &e.cur
	}
	if enc := ce.enc[name]; enc != nil {
		return enc, nil
	}
	enc, err := c.encode(cred, name)
	if err != nil {
		return nil, err
	}
	ce.enc[name] = enc
	return enc, nil
}

func (c *certCache) encode(cred *Credential, name string) (*encoded, error) {
	s, err := certSecret(name, cred)
	if err != nil {
		return nil, err
	}
	enc, err := encodeSecret(s)
	if err != nil {
		return nil, err
	}
	c.onEncode()
	return enc, nil
}

// versionOf is a SotW response's version_info: a hash of the sorted
// (name, version) pairs it holds.
func versionOf(res []*encoded) string {
	h := sha256.New()
	for _, r := range res {
		fmt.Fprintf(h, "%d:%s%d:%s", len(r.name), r.name, len(r.version), r.version)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}
