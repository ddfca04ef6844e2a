package ca

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// keyOpTimeout bounds one call to the key manager: an HSM that does not
// answer must not hold the CA's locks for ever.
const keyOpTimeout = 30 * time.Second

// keyRefCache holds the keys found in or created by Config.Keys, by
// reference, so that reloading the state does not ask the manager again.
type keyRefCache struct {
	mu   sync.Mutex
	keys map[string]crypto.Signer
}

func (c *keyRefCache) get(ref string) (crypto.Signer, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := c.keys[ref]
	return k, ok
}

func (c *keyRefCache) put(ref string, k crypto.Signer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys == nil {
		c.keys = map[string]crypto.Signer{}
	}
	c.keys[ref] = k
}

func (c *keyRefCache) drop(ref string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.keys, ref)
}

// refs returns the cached references.
func (c *keyRefCache) refs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.keys))
	for ref := range c.keys {
		out = append(out, ref)
	}
	return out
}

// errRequestInKeyManager refuses `ca rotate` on state whose keys are in a
// key manager: only the server opens it, so the CLI cannot make a key
// there, and a key in the state would defeat it.
var errRequestInKeyManager = errors.New("ca: the CA's keys are in a key manager (--key-manager), which only the running server opens; it prepares successors on schedule, so leave rotation to it")

// keyStorage is Authority.KeyStorage.
func (m *manager) keyStorage() string {
	if m.cfg.Keys == nil {
		return "state"
	}
	return m.keysName()
}

func (m *manager) keysName() string {
	if s, ok := m.cfg.Keys.(fmt.Stringer); ok {
		return s.String()
	}
	return "key manager"
}

// newKey makes a signing key of type kt: in Config.Keys, labelled label,
// returning its reference; or, without a key manager, in memory, to be
// stored in the state (ref "").
func (m *manager) newKey(kt KeyType, label string) (crypto.Signer, string, error) {
	if m.cfg.Keys == nil {
		key, err := GenerateKey(kt)
		return key, "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), keyOpTimeout)
	defer cancel()
	key, ref, err := m.cfg.Keys.CreateKey(ctx, kt, label)
	if err == nil && (key == nil || ref == "") {
		err = errors.New("it returned no key or an empty reference")
	}
	if err != nil {
		m.metrics.keyManagerErrors.WithLabelValues("create").Inc()
		return nil, "", fmt.Errorf("ca: create %s key %q in %s: %w", kt, label, m.keysName(), err)
	}
	m.keyRefs.put(ref, key)
	return key, ref, nil
}

// newRootKeyed mints a root whose key newKey makes, labelled with the
// trust domain and the root's serial.
func (m *manager) newRootKeyed(now time.Time) (*x509.Certificate, crypto.Signer, string, error) {
	td := m.cfg.TrustDomain
	return mintRootCert(td, now, m.cfg.RootTTL, m.cfg.SignsIntermediates, func(serial string) (crypto.Signer, string, error) {
		return m.newKey(m.cfg.KeyType, "trustbridge "+td.Name()+" root "+serial)
	})
}

// newRootCert mints a root of key type kt whose key is kept in the state;
// with intermediates it leaves room for one level of them.
func newRootCert(td spiffeid.TrustDomain, kt KeyType, now time.Time, ttl time.Duration, intermediates bool) (*x509.Certificate, crypto.Signer, error) {
	cert, key, _, err := mintRootCert(td, now, ttl, intermediates, func(string) (crypto.Signer, string, error) {
		key, err := GenerateKey(kt)
		return key, "", err
	})
	return cert, key, err
}

// jwtKeyManagerType is the KeyType a key manager makes for a JWT key type.
func jwtKeyManagerType(kt JWTKeyType) (KeyType, error) {
	switch kt {
	case JWTKeyES256:
		return KeyECP256, nil
	case JWTKeyES384:
		return KeyECP384, nil
	case JWTKeyRS256:
		return KeyRSA3072, nil
	}
	_, err := ParseJWTKeyType(string(kt))
	return "", err
}

// newJWTKeyKeyed is newJWTKey, with the key made by newKey. The label
// cannot carry the kid (the key's thumbprint, known only once it exists):
// it carries a random id instead.
func (m *manager) newJWTKeyKeyed(now time.Time) (*castate.JWTKey, error) {
	if m.cfg.Keys == nil {
		return newJWTKey(m.cfg.JWTKeyType, now, m.cfg.JWTKeyTTL)
	}
	kt, err := jwtKeyManagerType(m.cfg.JWTKeyType)
	if err != nil {
		return nil, err
	}
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, err
	}
	key, ref, err := m.newKey(kt, "trustbridge "+m.cfg.TrustDomain.Name()+" jwt "+hex.EncodeToString(nonce[:]))
	if err != nil {
		return nil, err
	}
	kid, err := jwtKID(key.Public())
	if err != nil {
		return nil, fmt.Errorf("ca: JWT key thumbprint: %w", err)
	}
	return &castate.JWTKey{JWTKeyRecord: castate.JWTKeyRecord{
		KID: kid, Algorithm: string(m.cfg.JWTKeyType), CreatedAt: now, NotAfter: now.Add(m.cfg.JWTKeyTTL), PreparedAt: now, KeyRef: ref,
	}, Key: key}, nil
}

// storedRootKey is the key the state stores for r: none when it is in a
// key manager.
func storedRootKey(r *castate.Root) (crypto.Signer, error) {
	if r.KeyRef != "" {
		return nil, nil
	}
	if r.Key == nil {
		return nil, fmt.Errorf("root %s has no private key", r.ID)
	}
	return r.Key, nil
}

// findKey returns the key ref names, from the cache or Config.Keys.
func (m *manager) findKey(what, ref string) (crypto.Signer, error) {
	if m.cfg.Keys == nil {
		return nil, fmt.Errorf("ca: %s's key is in a key manager (ref %s); start with --key-manager pkcs11 and the same token", what, ref)
	}
	if k, ok := m.keyRefs.get(ref); ok {
		return k, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), keyOpTimeout)
	defer cancel()
	k, err := m.cfg.Keys.FindKey(ctx, ref)
	if err == nil && k == nil {
		err = ErrKeyNotFound
	}
	if err != nil {
		m.metrics.keyManagerErrors.WithLabelValues("find").Inc()
		return nil, fmt.Errorf("ca: %s: find its key (ref %s) in %s: %w", what, ref, m.keysName(), err)
	}
	m.keyRefs.put(ref, k)
	return k, nil
}

// resolveKeys finds the keys of loaded roots and JWT keys whose record
// has a KeyRef, checking each against its certificate or kid.
func (m *manager) resolveKeys(roots []*castate.Root, jwtKeys []*castate.JWTKey) error {
	for _, r := range roots {
		if r.KeyRef == "" {
			continue
		}
		k, err := m.findKey("root "+r.ID, r.KeyRef)
		if err != nil {
			return err
		}
		if !publicKeysMatch(k.Public(), r.Cert.PublicKey) {
			return corrupt("root %s: the key %s holds for ref %s does not match the certificate", r.ID, m.keysName(), r.KeyRef)
		}
		r.Key = k
	}
	for _, jk := range jwtKeys {
		if jk.KeyRef == "" {
			continue
		}
		k, err := m.findKey("JWT key "+jk.KID, jk.KeyRef)
		if err != nil {
			return err
		}
		alg, aerr := jwtsvid.Algorithm(k.Public())
		if kid, err := jwtKID(k.Public()); err != nil || aerr != nil || kid != jk.KID || string(alg) != jk.Algorithm {
			return corrupt("JWT key %s: the key %s holds for ref %s does not match the kid or algorithm", jk.KID, m.keysName(), jk.KeyRef)
		}
		jk.Key = k
	}
	return nil
}

// destroyDroppedKeysLocked destroys, after a commit, the manager's keys
// this process knows of that the committed state no longer names: removed
// roots and JWT keys, and keys of decisions that were never committed;
// and the keys of revoked authorities, which a failure, a restart or a
// leader change may have left behind (destroying a key already gone is no
// error; each is tried once per process once it succeeded). A failure is
// logged and counted, and tried again after the next commit.
func (m *manager) destroyDroppedKeysLocked() {
	if m.cfg.Keys == nil {
		return
	}
	live := map[string]bool{}
	for _, r := range m.roots {
		live[r.KeyRef] = true
	}
	for _, k := range m.jwtKeys {
		live[k.KeyRef] = true
	}
	refs := m.keyRefs.refs()
	for _, ref := range revokedKeyRefs(m.journal.Revoked) {
		if !m.destroyed[ref] {
			refs = append(refs, ref)
		}
	}
	for _, ref := range refs {
		if live[ref] {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), keyOpTimeout)
		err := m.cfg.Keys.DestroyKey(ctx, ref)
		cancel()
		if err != nil {
			m.metrics.keyManagerErrors.WithLabelValues("destroy").Inc()
			m.cfg.Logger.Warn("CA could not destroy a key no longer used in "+m.keysName()+"; it will try again after the next change", "key_ref", ref, logattr.Error, err)
			continue
		}
		m.keyRefs.drop(ref)
		m.destroyed[ref] = true
		m.cfg.Logger.Info("CA destroyed a key no longer used in "+m.keysName(), "key_ref", ref)
	}
}

// revokedKeyRefs are the key manager references of revoked authorities.
func revokedKeyRefs(revoked []castate.RevokedRecord) []string {
	var out []string
	for _, rev := range revoked {
		switch {
		case rev.Root != nil && rev.Root.KeyRef != "":
			out = append(out, rev.Root.KeyRef)
		case rev.JWTKey != nil && rev.JWTKey.KeyRef != "":
			out = append(out, rev.JWTKey.KeyRef)
		}
	}
	return out
}
