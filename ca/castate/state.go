package castate

import (
	"crypto"
	"crypto/x509"
	"time"
)

// Journal is the persisted CA state: which roots exist, in which state,
// and the sequence number of the published bundle.
type Journal struct {
	Format      int    `json:"format"`
	TrustDomain string `json:"trust_domain"`
	Sequence    uint64 `json:"sequence"`
	// MaxWorkloadTTLSeconds is the longest leaf TTL ever allowed with
	// these roots. It only grows: a retired root stays published until
	// every leaf it could have signed has expired, and `ca issue` in
	// another process must not sign beyond what the server allows.
	MaxWorkloadTTLSeconds int64 `json:"max_workload_ttl_seconds"`
	// Settings of the serving process, so that `ca rotate` and `ca issue`
	// in another process follow them instead of their own defaults.
	Settings *JournalSettings `json:"settings,omitempty"`
	Roots    []RootRecord     `json:"roots"`
	// MaxJWTSVIDTTLSeconds is the longest JWT-SVID TTL ever allowed with
	// these JWT keys; like MaxWorkloadTTLSeconds it only grows, and a
	// retired JWT key stays published that long.
	MaxJWTSVIDTTLSeconds int64 `json:"max_jwt_svid_ttl_seconds,omitempty"`
	// JWTKeys are the JWT-SVID signing keys. State written before they
	// existed has none; the next leader's check bootstraps one.
	JWTKeys []JWTKeyRecord `json:"jwt_keys,omitempty"`
	// PluginRoots are the roots published in plug-in mode: those of the
	// directory, and earlier ones kept until the leaves they signed expire.
	PluginRoots []PluginRootRecord `json:"plugin_roots,omitempty"`
	// Revoked are the authorities an operator revoked (`ca authority
	// revoke`): gone from the bundle and from every key this state holds,
	// remembered until they expire so that the bundle names them as
	// revoked (peers refuse a bundle that brings one back) and nothing
	// here publishes them again.
	Revoked []RevokedRecord `json:"revoked,omitempty"`
	Updated time.Time       `json:"updated"`
	Events  []JournalNote   `json:"events,omitempty"`
}

// UsesKeyManager says whether j names a root or JWT key whose private key
// is in a key manager rather than in the state.
func (j *Journal) UsesKeyManager() bool {
	if j == nil {
		return false
	}
	for _, r := range j.Roots {
		if r.KeyRef != "" {
			return true
		}
	}
	for _, k := range j.JWTKeys {
		if k.KeyRef != "" {
			return true
		}
	}
	return false
}

// Clone deep-copies the journal.
func (j *Journal) Clone() *Journal {
	c := *j
	c.Roots = append([]RootRecord(nil), j.Roots...)
	c.JWTKeys = append([]JWTKeyRecord(nil), j.JWTKeys...)
	c.Events = append([]JournalNote(nil), j.Events...)
	c.PluginRoots = append([]PluginRootRecord(nil), j.PluginRoots...)
	c.Revoked = append([]RevokedRecord(nil), j.Revoked...)
	if j.Settings != nil {
		st := *j.Settings
		c.Settings = &st
	}
	return &c
}

// PluginRootRecord is a root published in plug-in mode. A root that left
// the directory has RemoveAfter set.
type PluginRootRecord struct {
	SHA256      string    `json:"sha256"`
	DER         []byte    `json:"der"`
	RemoveAfter time.Time `json:"remove_after,omitzero"`
}

// JournalSettings are the serving process's CA settings.
type JournalSettings struct {
	KeyType                   string `json:"key_type"` // a ca.KeyType
	RootTTLSeconds            int64  `json:"root_ttl_seconds"`
	RefreshHintSeconds        int64  `json:"refresh_hint_seconds"`
	CurrentMaxWorkloadSeconds int64  `json:"current_max_workload_ttl_seconds"`
	// JWT key settings, for `ca rotate --jwt`; absent in state written
	// before JWT keys existed.
	JWTKeyType               string `json:"jwt_key_type,omitempty"` // a ca.JWTKeyType
	JWTKeyTTLSeconds         int64  `json:"jwt_key_ttl_seconds,omitempty"`
	CurrentMaxJWTSVIDSeconds int64  `json:"current_max_jwt_svid_ttl_seconds,omitempty"`
	// SignsIntermediates: roots leave room for downstream intermediates
	// (Config.SignsIntermediates), also for roots `ca rotate` makes.
	SignsIntermediates bool `json:"signs_intermediates,omitempty"`
}

// JournalNote records a rotation event, newest last, for operators.
type JournalNote struct {
	At     time.Time `json:"at"`
	Event  string    `json:"event"`
	RootID string    `json:"root_id"`
	// KID names the JWT key of a JWT key event (RootID is empty then).
	KID string `json:"kid,omitempty"`
}

// maxJournalNotes bounds the event history kept in the journal.
const maxJournalNotes = 50

// RootRecord is one root in the journal.
type RootRecord struct {
	ID          string    `json:"id"` // hex serial number; names the files
	State       RootState `json:"state"`
	CertSHA256  string    `json:"cert_sha256"`
	PreparedAt  time.Time `json:"prepared_at"`
	ActivatedAt time.Time `json:"activated_at,omitzero"`
	RetiredAt   time.Time `json:"retired_at,omitzero"`
	// MinActivateAt is fixed when the root is prepared, from the refresh
	// hint published then: lowering the hint later must not shorten the
	// time peers had to fetch it.
	MinActivateAt time.Time `json:"min_activate_at,omitzero"`
	// PublishedAt is when a serving trustbridge first published the root
	// (or, after a restart, published it again). A root prepared by
	// `ca rotate` has none until the server picks it up, and the
	// publication lead counts from here.
	PublishedAt time.Time `json:"published_at,omitzero"`
	RemoveAfter time.Time `json:"remove_after,omitzero"`
	// Upstream is set on an intermediate an upstream signed
	// (Config.Upstream): the record then describes our signing
	// intermediate, not a root, and the bundle publishes its upstream
	// roots instead of it.
	Upstream *UpstreamRecord `json:"upstream,omitempty"`
	// KeyRef finds the root's key in the Config.Keys key manager; the
	// state then holds no private key for it.
	KeyRef string `json:"key_ref,omitempty"`
	// TaintedAt is when an operator tainted the root (`ca authority
	// taint`): it no longer signs, and every client re-issues what it
	// signed. Only a root that is not active can be tainted.
	TaintedAt time.Time `json:"tainted_at,omitzero"`
}

// Root is a root (or, in upstream mode, an intermediate) with its
// material.
type Root struct {
	RootRecord
	Cert *x509.Certificate
	Key  crypto.Signer
	// UpstreamChain and UpstreamRoots are RootRecord.Upstream parsed:
	// the upstream's intermediates above Cert, nearest first, and its
	// roots.
	UpstreamChain []*x509.Certificate
	UpstreamRoots []*x509.Certificate
}

// Published are the certificates the bundle carries for r: its upstream
// roots for an intermediate, else r itself.
func (r *Root) Published() []*x509.Certificate {
	if r.Upstream != nil {
		return r.UpstreamRoots
	}
	return []*x509.Certificate{r.Cert}
}

// RootState is where a root is in its life. Only the active root signs;
// prepared and retired roots are published so that federated peers trust
// them before they sign and until nothing they signed is still valid.
type RootState string

// Root states, in lifecycle order.
const (
	StatePrepared RootState = "prepared"
	StateActive   RootState = "active"
	StateRetired  RootState = "retired"
	// StateRevoked marks an authority an operator revoked: it is only in
	// Journal.Revoked, never among the roots or keys that are published.
	StateRevoked RootState = "revoked"
	// StateExternal marks roots of a plug-in CA directory: trustbridge
	// publishes them but their lifecycle is managed elsewhere.
	StateExternal RootState = "external"
)

// UpstreamRecord is what the journal keeps about an intermediate an
// upstream signed (RootRecord.Upstream): the certificates above it, so
// that every replica signs and publishes the same thing.
type UpstreamRecord struct {
	// Name is the upstream, as its String() named it.
	Name string `json:"name"`
	// ObtainedAt is when the upstream signed it.
	ObtainedAt time.Time `json:"obtained_at"`
	// Chain is the DER of the upstream's intermediates above ours, nearest
	// first, excluding roots.
	Chain [][]byte `json:"chain,omitempty"`
	// Roots is the DER of the upstream roots the chain verifies to; they
	// are what the bundle publishes.
	Roots [][]byte `json:"roots"`
}

// JWTKeyRecord is one JWT-SVID signing key in the journal. Its lifecycle
// is a root's (RootState, the same timeline): prepared and published
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
	// TaintedAt is when an operator tainted the key, as RootRecord's.
	TaintedAt time.Time `json:"tainted_at,omitzero"`
}

// JWTKey is a JWT signing key with its private key.
type JWTKey struct {
	JWTKeyRecord
	Key crypto.Signer
}

// RevokedRecord is an authority an operator revoked: an X.509 root (or,
// in upstream mode, an intermediate) with Root and DER set, or a JWT key
// with JWTKey and PublicKey set. It is kept until NotAfter, when nothing
// it could have signed is valid any more.
type RevokedRecord struct {
	RevokedAt time.Time `json:"revoked_at"`
	NotAfter  time.Time `json:"not_after"`
	// Root is the root's record as it was when revoked; DER its
	// certificate.
	Root *RootRecord `json:"root,omitempty"`
	DER  []byte      `json:"der,omitempty"`
	// JWTKey is the key's record as it was when revoked; PublicKey its
	// public key (PKIX DER).
	JWTKey    *JWTKeyRecord `json:"jwt_key,omitempty"`
	PublicKey []byte        `json:"public_key,omitempty"`
}
