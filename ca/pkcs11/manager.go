//go:build cgo

package pkcs11

import (
	"context"
	"crypto"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/ThalesGroup/crypto11"
	"github.com/miekg/pkcs11"

	"github.com/trustbridge/trustbridge/ca"
)

// Manager keeps CA keys in one PKCS#11 token. It implements ca.KeyManager
// and fmt.Stringer; it is safe for concurrent use.
type Manager struct {
	cfg Config
	p11 *crypto11.Context
	log *slog.Logger
}

var _ ca.KeyManager = (*Manager)(nil)

// New loads cfg.Module, finds the token and logs in with cfg.PIN. Its
// errors say which of the three failed: a missing module, no such token,
// or a PIN the token refused (the PIN itself is never in an error).
func New(cfg Config) (*Manager, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	p11, err := crypto11.Configure(&crypto11.Config{
		Path:       cfg.Module,
		TokenLabel: cfg.TokenLabel,
		SlotNumber: cfg.Slot,
		Pin:        cfg.PIN,
	})
	if err != nil {
		return nil, openError(&cfg, err)
	}
	log.Info("pkcs11 token opened", "module", cfg.Module, "token", cfg.token())
	return &Manager{cfg: cfg, p11: p11, log: log}, nil
}

// openError turns crypto11.Configure's error into one that names the
// failing input and how to fix it.
func openError(cfg *Config, err error) error {
	var code pkcs11.Error
	switch {
	case errors.As(err, &code) && (code == pkcs11.CKR_PIN_INCORRECT || code == pkcs11.CKR_PIN_INVALID || code == pkcs11.CKR_PIN_LEN_RANGE):
		return fmt.Errorf("pkcs11: the PIN was refused by %s (%w); check --pkcs11-pin-file or %s", cfg.token(), err, PINEnv)
	case errors.As(err, &code) && code == pkcs11.CKR_PIN_LOCKED:
		return fmt.Errorf("pkcs11: the PIN of %s is locked after too many wrong PINs (%w); the security officer must unlock it", cfg.token(), err)
	case strings.Contains(err.Error(), "could not find PKCS#11 token"):
		return fmt.Errorf("pkcs11: %s not found in module %s: %w; list the tokens with the vendor's tool (softhsm2-util --show-slots, pkcs11-tool --list-slots)", cfg.token(), cfg.Module, err)
	case strings.Contains(err.Error(), "failed to create module context"):
		return fmt.Errorf("--pkcs11-module %s: cannot load it as a PKCS#11 library: %w", cfg.Module, err)
	}
	return fmt.Errorf("pkcs11: opening %s in module %s: %w", cfg.token(), cfg.Module, err)
}

// token names the selected token for messages.
func (c *Config) token() string {
	if c.TokenLabel != "" {
		return fmt.Sprintf("token %q", c.TokenLabel)
	}
	return fmt.Sprintf("slot %d", *c.Slot)
}

// String names the token and module, as in
// `pkcs11 token "trustbridge" (libsofthsm2.so)`.
func (m *Manager) String() string {
	return fmt.Sprintf("pkcs11 %s (%s)", m.cfg.token(), filepath.Base(m.cfg.Module))
}

// CreateKey generates a key pair of type kt inside the token, with
// CKA_LABEL label and a random 16-byte CKA_ID; the private key is
// sensitive and not extractable. The reference is "pkcs11:id=<hex id>".
// crypto11 takes no context: ctx is checked before the token is called,
// and a generation under way is not interrupted.
func (m *Manager) CreateKey(ctx context.Context, kt ca.KeyType, label string) (crypto.Signer, string, error) {
	if _, err := ca.ParseKeyType(string(kt)); err != nil {
		return nil, "", fmt.Errorf("pkcs11: %w", err)
	}
	id := make([]byte, idLen)
	if _, err := rand.Read(id); err != nil {
		return nil, "", fmt.Errorf("pkcs11: key id: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	key, err := m.generate(kt, id, []byte(label))
	if err != nil {
		return nil, "", fmt.Errorf("pkcs11: generating a %s key labelled %q in %s: %w", kt, label, m, err)
	}
	ref := formatRef(id)
	m.log.Info("pkcs11 key created", "ref", ref, "label", label, "type", string(kt))
	return key, ref, nil
}

func (m *Manager) generate(kt ca.KeyType, id, label []byte) (crypto.Signer, error) {
	switch kt {
	case ca.KeyECP256:
		return m.p11.GenerateECDSAKeyPairWithLabel(id, label, elliptic.P256())
	case ca.KeyECP384:
		return m.p11.GenerateECDSAKeyPairWithLabel(id, label, elliptic.P384())
	case ca.KeyRSA2048:
		return m.p11.GenerateRSAKeyPairWithLabel(id, label, 2048)
	case ca.KeyRSA3072:
		return m.p11.GenerateRSAKeyPairWithLabel(id, label, 3072)
	case ca.KeyRSA4096:
		return m.p11.GenerateRSAKeyPairWithLabel(id, label, 4096)
	}
	return nil, fmt.Errorf("unknown key type %q", kt)
}

// FindKey returns the key pair whose CKA_ID ref names, or an error
// wrapping ca.ErrKeyNotFound when the token holds none. ctx is checked
// before the token is called (crypto11 takes no context).
func (m *Manager) FindKey(ctx context.Context, ref string) (crypto.Signer, error) {
	key, err := m.find(ctx, ref)
	if err != nil {
		return nil, err
	}
	return key, nil
}

func (m *Manager) find(ctx context.Context, ref string) (crypto11.Signer, error) {
	id, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	keys, err := m.p11.FindKeyPairs(id, nil)
	if err != nil {
		return nil, fmt.Errorf("pkcs11: finding key %s in %s: %w", ref, m, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("pkcs11: key %s in %s: %w (deleted, or another token?)", ref, m, ca.ErrKeyNotFound)
	}
	return keys[0], nil
}

// DestroyKey deletes the private and public key ref names from the token.
// A key already gone is not an error.
func (m *Manager) DestroyKey(ctx context.Context, ref string) error {
	key, err := m.find(ctx, ref)
	if errors.Is(err, ca.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := key.Delete(); err != nil {
		return fmt.Errorf("pkcs11: deleting key %s from %s: %w", ref, m, err)
	}
	m.log.Info("pkcs11 key destroyed", "ref", ref)
	return nil
}

// Close logs out and releases the token; keys it returned stop working.
func (m *Manager) Close() error {
	if err := m.p11.Close(); err != nil {
		return fmt.Errorf("pkcs11: closing %s: %w", m, err)
	}
	return nil
}
