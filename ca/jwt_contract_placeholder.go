package ca

// PLACEHOLDER: the lead deletes this file at merge. Helper "cajwt" defines
// these for real; jwtview only codes against the shared contract.

import (
	"crypto"
	"time"
)

// JWTKeyRecord is one JWT signing key in the journal (placeholder).
type JWTKeyRecord struct {
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
}

// JWTKeyInfo is a JWT signing key with its public key (placeholder).
type JWTKeyInfo struct {
	JWTKeyRecord
	Public crypto.PublicKey
}

// JWTKeys lists the JWT signing keys and their state (placeholder).
func (a *Authority) JWTKeys() []JWTKeyInfo { return nil }
