package castate

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"slices"

	"github.com/go-jose/go-jose/v4"

	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/pemfile"
)

// MaxJournalSize bounds an encoded journal; larger ones are refused as
// corrupt.
const MaxJournalSize = maxJournal

const (
	journalName   = "state.json"
	journalFormat = 1
	maxJournal    = 1 << 20
)

// JournalKey names the journal inside a state store that holds named
// blobs (files, Secret keys); RootCertKey and RootKeyKey name a root's
// material.
const JournalKey = journalName

// RootCertKey is the name of root id's certificate.
func RootCertKey(id string) string { return id + ".crt.pem" }

// RootKeyKey is the name of root id's private key.
func RootKeyKey(id string) string { return id + ".key.pem" }

// EncodeJournal bounds j's event history, sets its format and returns the
// JSON written to the state store.
func EncodeJournal(j *Journal) ([]byte, error) {
	j.Format = journalFormat
	if len(j.Events) > maxJournalNotes {
		j.Events = j.Events[len(j.Events)-maxJournalNotes:]
	}
	data, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return nil, err
	}
	data = append(data, '\n')
	if len(data) > maxJournal {
		return nil, fmt.Errorf("journal of %d bytes is larger than the %d a load reads", len(data), maxJournal)
	}
	return data, nil
}

// DecodeJournal parses a journal and checks it: its format, its trust
// domain (any, when td is empty), unique and safe root ids, known states
// and at most one active root. Every refusal wraps ErrCorruptState; a
// journal of another trust domain is a *TrustDomainError, which says so
// without calling it corrupt.
func DecodeJournal(data []byte, td string) (*Journal, error) {
	if len(data) > maxJournal {
		return nil, corrupt("%s is larger than %d bytes", journalName, maxJournal)
	}
	var j Journal
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return nil, corrupt("%s does not parse: %v", journalName, err)
	}
	if dec.More() {
		return nil, corrupt("%s has data after the journal", journalName)
	}
	if j.Format != journalFormat {
		return nil, corrupt("%s has format %d, this trustbridge reads %d", journalName, j.Format, journalFormat)
	}
	if td != "" && j.TrustDomain != td {
		return nil, &TrustDomainError{Holds: j.TrustDomain, Want: td}
	}
	if err := checkRootRecords(j.Roots); err != nil {
		return nil, err
	}
	if err := checkRevoked(&j); err != nil {
		return nil, err
	}
	if err := checkUpstreamRecords(j.Roots); err != nil {
		return nil, err
	}
	if err := checkJWTRecords(j.JWTKeys); err != nil {
		return nil, err
	}
	return &j, nil
}

// checkRootRecords checks the journal's roots: unique, safe ids, known
// states, at most one active and that one not tainted. Refusals wrap
// ErrCorruptState.
func checkRootRecords(recs []RootRecord) error {
	seen := map[string]bool{}
	active := 0
	for i, rec := range recs {
		if seen[rec.ID] || !SafeID(rec.ID) {
			return corrupt("%s: root %d has a missing, unsafe or duplicate id %q", journalName, i, rec.ID)
		}
		seen[rec.ID] = true
		switch rec.State {
		case StateActive:
			active++
		case StatePrepared, StateRetired:
		default:
			return corrupt("%s: root %s has unknown state %q", journalName, rec.ID, rec.State)
		}
		if rec.State == StateActive && !rec.TaintedAt.IsZero() {
			return corrupt("%s: root %s is active and tainted", journalName, rec.ID)
		}
	}
	if active > 1 {
		return corrupt("%s names %d active roots", journalName, active)
	}
	return nil
}

// checkRevoked checks the journal's revoked authorities: each one root
// (with a certificate whose fingerprint its record names) or one JWT key
// (with a public key whose thumbprint is its kid), and none of them also
// among the roots or keys in use: a state that holds a revoked authority
// again would publish it. Refusals wrap ErrCorruptState.
func checkRevoked(j *Journal) error {
	inUse := map[string]bool{}
	for _, r := range j.Roots {
		inUse["x509:"+r.ID] = true
		inUse["sha256:"+r.CertSHA256] = true
	}
	for _, k := range j.JWTKeys {
		inUse["jwt:"+k.KID] = true
	}
	for i, rev := range j.Revoked {
		keys, err := revokedKeys(i, rev)
		if err != nil {
			return err
		}
		for _, k := range keys {
			if inUse[k] {
				return corrupt("%s: revoked authority %s is also in use: the state would publish an authority an operator revoked (restore a backup taken after the revocation, or revoke it again)", journalName, k)
			}
			inUse[k] = true
		}
	}
	return nil
}

// revokedKeys names the i-th revoked authority as checkRevoked indexes
// authorities in use, after checking its material matches its record.
func revokedKeys(i int, rev RevokedRecord) ([]string, error) {
	switch {
	case rev.Root != nil && rev.JWTKey == nil:
		if rev.Root.State != StateRevoked {
			return nil, corrupt("%s: revoked authority %d: root %s has state %q, not %q", journalName, i, rev.Root.ID, rev.Root.State, StateRevoked)
		}
		cert, err := x509.ParseCertificate(rev.DER)
		if err != nil || fingerprint(cert) != rev.Root.CertSHA256 || !SafeID(rev.Root.ID) {
			return nil, corrupt("%s: revoked authority %d: the root's certificate does not parse or does not match its record", journalName, i)
		}
		return []string{"x509:" + rev.Root.ID, "sha256:" + rev.Root.CertSHA256}, nil
	case rev.JWTKey != nil && rev.Root == nil:
		if rev.JWTKey.State != StateRevoked {
			return nil, corrupt("%s: revoked authority %d: JWT key %s has state %q, not %q", journalName, i, rev.JWTKey.KID, rev.JWTKey.State, StateRevoked)
		}
		pub, err := x509.ParsePKIXPublicKey(rev.PublicKey)
		if err != nil {
			return nil, corrupt("%s: revoked authority %d: the JWT key does not parse", journalName, i)
		}
		if kid, err := jwtKID(pub); err != nil || kid != rev.JWTKey.KID {
			return nil, corrupt("%s: revoked authority %d: the JWT key does not match its kid", journalName, i)
		}
		return []string{"jwt:" + rev.JWTKey.KID}, nil
	}
	return nil, corrupt("%s: revoked authority %d is neither one root nor one JWT key", journalName, i)
}

// SafeID accepts ids that are safe as file names and Secret keys:
// root ids are hex serial numbers.
func SafeID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// EncodeRoot returns r's certificate and PKCS#8 private key as PEM; the
// key is nil for a root whose key is in a key manager (KeyRef).
func EncodeRoot(r *Root) (certPEM, keyPEM []byte, err error) {
	if r.Cert != nil && r.KeyRef != "" {
		return pemCert(r.Cert), nil, nil
	}
	if r.Cert == nil || r.Key == nil {
		return nil, nil, fmt.Errorf("root %s has no certificate or no key", r.ID)
	}
	der, err := x509.MarshalPKCS8PrivateKey(r.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("root %s: %w", r.ID, err)
	}
	return pemCert(r.Cert), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// DecodeRoot parses the material of the root rec names and checks it: one
// PEM certificate whose fingerprint is the journal's, and a private key
// that matches it. A record with a KeyRef has no key in the state (keyPEM
// must be empty); its Key stays nil until the Authority finds it in its
// key manager. Every refusal wraps ErrCorruptState and never quotes
// the key.
func DecodeRoot(rec RootRecord, certPEM, keyPEM []byte) (*Root, error) {
	certs, err := pemfile.ParseCertificates(certPEM)
	if err != nil {
		return nil, corrupt("root %s: certificate: %v", rec.ID, err)
	}
	if len(certs) != 1 {
		return nil, corrupt("root %s: certificate file holds %d certificates, want 1", rec.ID, len(certs))
	}
	cert := certs[0]
	if fingerprint(cert) != rec.CertSHA256 {
		return nil, corrupt("root %s: certificate does not match the fingerprint in %s", rec.ID, journalName)
	}
	r := &Root{RootRecord: rec, Cert: cert}
	if r.Key, err = decodeRootKey(rec, cert, keyPEM); err != nil {
		return nil, err
	}
	if rec.Upstream != nil {
		if r.UpstreamChain, r.UpstreamRoots, err = decodeUpstreamRecord(rec.ID, cert, rec.Upstream); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// decodeRootKey parses the private key of the root rec names, nil for one
// in a key manager (rec.KeyRef), whose state must hold none.
func decodeRootKey(rec RootRecord, cert *x509.Certificate, keyPEM []byte) (crypto.Signer, error) {
	if rec.KeyRef != "" {
		if len(keyPEM) > 0 {
			return nil, corrupt("root %s: its key is in a key manager (ref %s), yet the state holds a private key for it", rec.ID, rec.KeyRef)
		}
		return nil, nil
	}
	key, err := pemfile.ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, corrupt("root %s: private key: %v", rec.ID, err)
	}
	if !publicKeysMatch(key.Public(), cert.PublicKey) {
		return nil, corrupt("root %s: private key does not match the certificate", rec.ID)
	}
	return key, nil
}

// maxUpstreamName bounds an upstream's recorded name.
const maxUpstreamName = 256

// checkUpstreamRecords refuses a journal that mixes self-signed roots
// with intermediates an upstream signed (no mode publishes both), and
// upstream records that are plainly damaged; decodeUpstreamRecord checks
// their certificates.
func checkUpstreamRecords(recs []RootRecord) error {
	upstream := 0
	for _, rec := range recs {
		if rec.Upstream == nil {
			continue
		}
		upstream++
		u := rec.Upstream
		if len(u.Name) > maxUpstreamName || u.ObtainedAt.IsZero() || len(u.Roots) == 0 {
			return corrupt("%s: intermediate %s has an upstream record without roots, time obtained, or with a name over %d bytes", journalName, rec.ID, maxUpstreamName)
		}
	}
	if upstream > 0 && upstream != len(recs) {
		return corrupt("%s mixes %d self-signed roots with %d upstream-signed intermediates", journalName, len(recs)-upstream, upstream)
	}
	return nil
}

// JWTKeyKey is the name of JWT key kid's private key in a store of named
// blobs. The prefix keeps it apart from root files, whose ids are hex.
func JWTKeyKey(kid string) string { return jwtKeyPrefix + kid + ".key.pem" }

const jwtKeyPrefix = "jwt-"

// EncodeJWTKey returns k's PKCS#8 private key as PEM; nil for a key in a
// key manager (KeyRef).
func EncodeJWTKey(k *JWTKey) ([]byte, error) {
	if k.KeyRef != "" {
		return nil, nil
	}
	if k.Key == nil {
		return nil, fmt.Errorf("JWT key %s has no private key", k.KID)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k.Key)
	if err != nil {
		return nil, fmt.Errorf("JWT key %s: %w", k.KID, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// DecodeJWTKey parses the private key of the JWT key rec names and checks
// it: a key of the journal's algorithm whose thumbprint is the kid. Every
// refusal wraps ErrCorruptState and never quotes the key. A record with a
// KeyRef has no key in the state (keyPEM must be empty); its Key stays nil
// until the Authority finds it in its key manager.
func DecodeJWTKey(rec JWTKeyRecord, keyPEM []byte) (*JWTKey, error) {
	if rec.KeyRef != "" {
		if len(keyPEM) > 0 {
			return nil, corrupt("JWT key %s: its key is in a key manager (ref %s), yet the state holds a private key for it", rec.KID, rec.KeyRef)
		}
		return &JWTKey{JWTKeyRecord: rec}, nil
	}
	key, err := pemfile.ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, corrupt("JWT key %s: private key: %v", rec.KID, err)
	}
	alg, err := jwtsvid.Algorithm(key.Public())
	if err != nil {
		return nil, corrupt("JWT key %s: %v", rec.KID, err)
	}
	if string(alg) != rec.Algorithm {
		return nil, corrupt("JWT key %s: key is for %s, %s names %s", rec.KID, alg, journalName, rec.Algorithm)
	}
	if kid, err := jwtKID(key.Public()); err != nil || kid != rec.KID {
		return nil, corrupt("JWT key %s: private key does not match the kid in %s", rec.KID, journalName)
	}
	return &JWTKey{JWTKeyRecord: rec, Key: key}, nil
}

// checkJWTRecords checks the journal's JWT keys: unique, safe kids, known
// algorithms and states, at most one active. Refusals wrap ErrCorruptState.
func checkJWTRecords(recs []JWTKeyRecord) error {
	seen := map[string]bool{}
	active := 0
	for i, rec := range recs {
		if seen[rec.KID] || !SafeID(rec.KID) {
			return corrupt("%s: JWT key %d has a missing, unsafe or duplicate kid %q", journalName, i, rec.KID)
		}
		seen[rec.KID] = true
		if !slices.Contains(jwtAlgorithms, rec.Algorithm) {
			return corrupt("%s: JWT key %s has unknown algorithm %q", journalName, rec.KID, rec.Algorithm)
		}
		switch rec.State {
		case StateActive:
			active++
		case StatePrepared, StateRetired:
		default:
			return corrupt("%s: JWT key %s has unknown state %q", journalName, rec.KID, rec.State)
		}
		if rec.State == StateActive && !rec.TaintedAt.IsZero() {
			return corrupt("%s: JWT key %s is active and tainted", journalName, rec.KID)
		}
	}
	if active > 1 {
		return corrupt("%s names %d active JWT keys", journalName, active)
	}
	return nil
}

// decodeUpstreamRecord parses an intermediate's journal record and checks
// that cert, the intermediate, chains through it to one of its roots by
// signature (not by time: a retired intermediate may have expired).
func decodeUpstreamRecord(id string, cert *x509.Certificate, rec *UpstreamRecord) (chain, roots []*x509.Certificate, err error) {
	if len(rec.Roots) == 0 || 1+len(rec.Chain)+len(rec.Roots) > maxUpstreamCerts {
		return nil, nil, corrupt("intermediate %s: upstream record has %d chain certificates and %d roots; want at least one root and at most %d in all",
			id, len(rec.Chain), len(rec.Roots), maxUpstreamCerts)
	}
	if chain, err = parseDERs(id, "chain", rec.Chain); err != nil {
		return nil, nil, err
	}
	if roots, err = parseDERs(id, "root", rec.Roots); err != nil {
		return nil, nil, err
	}
	for _, r := range roots {
		if !r.BasicConstraintsValid || !r.IsCA {
			return nil, nil, corrupt("intermediate %s: upstream root %s is not a CA", id, describe(r))
		}
	}
	if !cert.BasicConstraintsValid || !cert.IsCA {
		return nil, nil, corrupt("intermediate %s: certificate is not a CA", id)
	}
	top := cert
	for _, c := range chain {
		if err := top.CheckSignatureFrom(c); err != nil {
			return nil, nil, corrupt("intermediate %s: %s did not sign %s: %v", id, describe(c), describe(top), err)
		}
		top = c
	}
	for _, r := range roots {
		if top.CheckSignatureFrom(r) == nil {
			return chain, roots, nil
		}
	}
	return nil, nil, corrupt("intermediate %s: no recorded upstream root signed %s", id, describe(top))
}

func parseDERs(id, what string, ders [][]byte) ([]*x509.Certificate, error) {
	size := 0
	out := make([]*x509.Certificate, 0, len(ders))
	for i, der := range ders {
		size += len(der)
		if size > maxUpstreamBytes {
			return nil, corrupt("intermediate %s: upstream record is larger than %d bytes", id, maxUpstreamBytes)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, corrupt("intermediate %s: upstream %s %d: %v", id, what, i, err)
		}
		out = append(out, c)
	}
	return out, nil
}

// jwtAlgorithms are the JWS names of ca.JWTKeyType, the algorithms a
// journal may record for a JWT key.
var jwtAlgorithms = []string{"ES256", "ES384", "RS256"}

// Bounds on what the journal may record for one intermediate: a real
// chain has two or three certificates.
const (
	maxUpstreamCerts = 8
	maxUpstreamBytes = 64 << 10
)

func corrupt(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCorruptState}, a...)...)
}

// Fingerprint is the hex SHA-256 of c's DER, as the journal records it.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

func fingerprint(c *x509.Certificate) string { return Fingerprint(c) }

func publicKeysMatch(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}

func pemCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// jwtKID is the RFC 7638 thumbprint of pub.
func jwtKID(pub crypto.PublicKey) (string, error) {
	sum, err := (&jose.JSONWebKey{Key: pub}).Thumbprint(crypto.SHA256)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(sum), nil
}

// describe names a certificate in errors the way an operator finds it:
// subject and serial.
func describe(c *x509.Certificate) string {
	return fmt.Sprintf("%q (serial %s)", c.Subject.String(), c.SerialNumber)
}
