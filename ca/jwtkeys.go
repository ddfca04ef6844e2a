package ca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/pemfile"
)

// JWTKeyType names the JWS algorithm of the CA's JWT-SVID signing keys,
// and with it the key it generates. The values are the JWS names
// operators know from tokens, so they are stable.
type JWTKeyType string

// JWT key types.
const (
	JWTKeyES256 JWTKeyType = "ES256" // ECDSA P-256, the default
	JWTKeyES384 JWTKeyType = "ES384" // ECDSA P-384
	// JWTKeyRS256 is RSA of jwtRSABits: verifiers that only speak RSA
	// (some cloud OIDC federations) get a key that is not the weakest
	// jwtsvid.Mint accepts.
	JWTKeyRS256 JWTKeyType = "RS256"
)

const jwtRSABits = 3072

func jwtKeyTypes() []JWTKeyType { return []JWTKeyType{JWTKeyES256, JWTKeyES384, JWTKeyRS256} }

// ParseJWTKeyType parses a configured JWT key type; matching is exact, as
// in a JWS header.
func ParseJWTKeyType(s string) (JWTKeyType, error) {
	names := make([]string, 0, 3)
	for _, kt := range jwtKeyTypes() {
		if s == string(kt) {
			return kt, nil
		}
		names = append(names, string(kt))
	}
	return "", fmt.Errorf("ca: unknown JWT key type %q (valid: %s)", s, strings.Join(names, ", "))
}

func generateJWTKey(kt JWTKeyType) (crypto.Signer, error) {
	var (
		key crypto.Signer
		err error
	)
	switch kt {
	case JWTKeyES256:
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case JWTKeyES384:
		key, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case JWTKeyRS256:
		key, err = rsa.GenerateKey(rand.Reader, jwtRSABits)
	default:
		_, err = ParseJWTKeyType(string(kt))
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("ca: generate %s JWT key: %w", kt, err)
	}
	return key, nil
}

// JWTKeyRecord is one JWT-SVID signing key in the journal. Its lifecycle
// is a root's (RootState, the same Timeline): prepared and published
// first, active (the one that signs), retired and still published until
// every JWT-SVID it signed has expired.
type JWTKeyRecord struct {
	// KID is the key's RFC 7638 thumbprint (SHA-256, base64url): unique,
	// URL-safe, and bound to the key, so a swapped key file is noticed.
	KID           string    `json:"kid"`
	State         RootState `json:"state"`
	Algorithm     string    `json:"algorithm"`
	CreatedAt     time.Time `json:"created_at"`
	NotAfter      time.Time `json:"not_after"`
	PreparedAt    time.Time `json:"prepared_at"`
	MinActivateAt time.Time `json:"min_activate_at,omitzero"`
	PublishedAt   time.Time `json:"published_at,omitzero"`
	ActivatedAt   time.Time `json:"activated_at,omitzero"`
	RetiredAt     time.Time `json:"retired_at,omitzero"`
	RemoveAfter   time.Time `json:"remove_after,omitzero"`
	// KeyRef finds the key in the Config.Keys key manager; the state then
	// holds no private key for it.
	KeyRef string `json:"key_ref,omitempty"`
}

// JWTKeyInfo describes a JWT signing key for status reports.
type JWTKeyInfo struct {
	JWTKeyRecord
	Public crypto.PublicKey
}

// JWTKey is a JWT signing key with its private key.
type JWTKey struct {
	JWTKeyRecord
	Key crypto.Signer
}

func (k *JWTKey) times() RootTimes {
	return RootTimes{
		State: k.State, NotBefore: k.CreatedAt, NotAfter: k.NotAfter,
		PreparedAt: k.PreparedAt, MinActivateAt: k.MinActivateAt, PublishedAt: k.PublishedAt, RemoveAfter: k.RemoveAfter,
	}
}

// JWTKeyKey is the name of JWT key kid's private key in a store of named
// blobs. The prefix keeps it apart from root files, whose ids are hex.
func JWTKeyKey(kid string) string { return jwtKeyPrefix + kid + ".key.pem" }

const jwtKeyPrefix = "jwt-"

// jwtKID is the RFC 7638 thumbprint of pub.
func jwtKID(pub crypto.PublicKey) (string, error) {
	sum, err := (&jose.JSONWebKey{Key: pub}).Thumbprint(crypto.SHA256)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(sum), nil
}

// newJWTKey generates a key of type kt valid from now for ttl.
func newJWTKey(kt JWTKeyType, now time.Time, ttl time.Duration) (*JWTKey, error) {
	key, err := generateJWTKey(kt)
	if err != nil {
		return nil, err
	}
	kid, err := jwtKID(key.Public())
	if err != nil {
		return nil, fmt.Errorf("ca: JWT key thumbprint: %w", err)
	}
	return &JWTKey{JWTKeyRecord: JWTKeyRecord{
		KID: kid, Algorithm: string(kt), CreatedAt: now, NotAfter: now.Add(ttl), PreparedAt: now,
	}, Key: key}, nil
}

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
		if seen[rec.KID] || !safeRootID(rec.KID) {
			return corrupt("%s: JWT key %d has a missing, unsafe or duplicate kid %q", journalName, i, rec.KID)
		}
		seen[rec.KID] = true
		if _, err := ParseJWTKeyType(rec.Algorithm); err != nil {
			return corrupt("%s: JWT key %s has unknown algorithm %q", journalName, rec.KID, rec.Algorithm)
		}
		switch rec.State {
		case StateActive:
			active++
		case StatePrepared, StateRetired:
		default:
			return corrupt("%s: JWT key %s has unknown state %q", journalName, rec.KID, rec.State)
		}
	}
	if active > 1 {
		return corrupt("%s names %d active JWT keys", journalName, active)
	}
	return nil
}

// checkJWTCommit refuses to persist a journal whose JWT keys are not
// exactly the ones given with material.
func checkJWTCommit(j *Journal, keys []*JWTKey) error {
	if len(j.JWTKeys) != len(keys) {
		return fmt.Errorf("journal names %d JWT keys, %d given", len(j.JWTKeys), len(keys))
	}
	for i, rec := range j.JWTKeys {
		if keys[i].KID != rec.KID {
			return fmt.Errorf("journal JWT key %d is %s, material is for %s", i, rec.KID, keys[i].KID)
		}
		if !safeRootID(rec.KID) {
			return fmt.Errorf("unsafe JWT kid %q", rec.KID)
		}
	}
	return nil
}

func cloneJWTKeys(keys []*JWTKey) []*JWTKey {
	out := make([]*JWTKey, len(keys))
	for i, k := range keys {
		c := *k
		out[i] = &c
	}
	return out
}
