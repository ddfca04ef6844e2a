package ca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/trustbridge/trustbridge/ca/castate"
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

// JWTKeyInfo describes a JWT signing key for status reports.
type JWTKeyInfo struct {
	castate.JWTKeyRecord
	Public crypto.PublicKey
	// RevokedAt is when an operator revoked the key (State is then
	// castate.StateRevoked): it is no longer published.
	RevokedAt time.Time
}

func jwtKeyTimes(k *castate.JWTKey) rootTimes {
	return rootTimes{
		State: k.State, NotBefore: k.CreatedAt, NotAfter: k.NotAfter,
		PreparedAt: k.PreparedAt, MinActivateAt: k.MinActivateAt, PublishedAt: k.PublishedAt, RemoveAfter: k.RemoveAfter,
	}
}

// jwtKID is the RFC 7638 thumbprint of pub.
func jwtKID(pub crypto.PublicKey) (string, error) {
	sum, err := (&jose.JSONWebKey{Key: pub}).Thumbprint(crypto.SHA256)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(sum), nil
}

// newJWTKey generates a key of type kt valid from now for ttl.
func newJWTKey(kt JWTKeyType, now time.Time, ttl time.Duration) (*castate.JWTKey, error) {
	key, err := generateJWTKey(kt)
	if err != nil {
		return nil, err
	}
	kid, err := jwtKID(key.Public())
	if err != nil {
		return nil, fmt.Errorf("ca: JWT key thumbprint: %w", err)
	}
	return &castate.JWTKey{JWTKeyRecord: castate.JWTKeyRecord{
		KID: kid, Algorithm: string(kt), CreatedAt: now, NotAfter: now.Add(ttl), PreparedAt: now,
	}, Key: key}, nil
}

// checkJWTCommit refuses to persist a journal whose JWT keys are not
// exactly the ones given with material.
func checkJWTCommit(j *castate.Journal, keys []*castate.JWTKey) error {
	if len(j.JWTKeys) != len(keys) {
		return fmt.Errorf("journal names %d JWT keys, %d given", len(j.JWTKeys), len(keys))
	}
	for i, rec := range j.JWTKeys {
		if keys[i].KID != rec.KID {
			return fmt.Errorf("journal JWT key %d is %s, material is for %s", i, rec.KID, keys[i].KID)
		}
		if !castate.SafeID(rec.KID) {
			return fmt.Errorf("unsafe JWT kid %q", rec.KID)
		}
	}
	return nil
}

func cloneJWTKeys(keys []*castate.JWTKey) []*castate.JWTKey {
	out := make([]*castate.JWTKey, len(keys))
	for i, k := range keys {
		c := *k
		out[i] = &c
	}
	return out
}
