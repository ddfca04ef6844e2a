package pkcs11

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// PINEnv is the environment variable ReadPIN falls back to.
const PINEnv = "TRUSTBRIDGE_PKCS11_PIN"

// maxPINFile bounds what ReadPIN reads: a PIN file is a few bytes.
const maxPINFile = 1024

// refPrefix starts every reference this package hands out; the rest is
// the key's CKA_ID in lowercase hex.
const refPrefix = "pkcs11:id="

// idLen is the length of the random CKA_ID of a key made by CreateKey.
const idLen = 16

// Config selects a PKCS#11 token and logs in to it.
type Config struct {
	// Module is the absolute path of the vendor's PKCS#11 library, for
	// example /usr/lib/softhsm/libsofthsm2.so (--pkcs11-module).
	Module string
	// TokenLabel selects the token by its label (--pkcs11-token-label).
	// Exactly one of TokenLabel and Slot is set.
	TokenLabel string
	// Slot selects the token by slot number (--pkcs11-slot).
	Slot *int
	// PIN is the user PIN (ReadPIN reads it). Never logged.
	PIN string
	// Logger gets one line when the token is opened and one per key
	// created or destroyed; nil discards them.
	Logger *slog.Logger
}

func (c *Config) validate() error {
	if c.Module == "" {
		return errors.New("pkcs11: no module: set --pkcs11-module to the absolute path of the HSM's PKCS#11 library (.so)")
	}
	if !filepath.IsAbs(c.Module) {
		return fmt.Errorf("--pkcs11-module %s: not an absolute path; give the full path of the PKCS#11 library", c.Module)
	}
	if _, err := os.Stat(c.Module); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("--pkcs11-module %s: no such file; install the HSM's PKCS#11 library or fix the path", c.Module)
	} else if err != nil {
		return fmt.Errorf("--pkcs11-module %s: %w", c.Module, err)
	}
	switch {
	case c.TokenLabel == "" && c.Slot == nil:
		return errors.New("pkcs11: no token selected: set one of --pkcs11-token-label and --pkcs11-slot")
	case c.TokenLabel != "" && c.Slot != nil:
		return errors.New("pkcs11: both --pkcs11-token-label and --pkcs11-slot set: set only one")
	case c.Slot != nil && *c.Slot < 0:
		return fmt.Errorf("--pkcs11-slot %d: a slot number is not negative", *c.Slot)
	}
	if c.PIN == "" {
		return fmt.Errorf("pkcs11: no PIN: set --pkcs11-pin-file or %s", PINEnv)
	}
	return nil
}

// ReadPIN returns the token's user PIN: the content of file (at most
// 1 KiB, one trailing newline trimmed) when file is set, else the value
// of the environment variable TRUSTBRIDGE_PKCS11_PIN read through getenv.
// An empty PIN is refused. The PIN is never part of an error.
func ReadPIN(file string, getenv func(string) string) (string, error) {
	if file == "" {
		if pin := getenv(PINEnv); pin != "" {
			return pin, nil
		}
		return "", fmt.Errorf("pkcs11: no PIN: set --pkcs11-pin-file FILE or the environment variable %s", PINEnv)
	}
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("--pkcs11-pin-file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxPINFile+1))
	if err != nil {
		return "", fmt.Errorf("--pkcs11-pin-file %s: %w", file, err)
	}
	if len(b) > maxPINFile {
		return "", fmt.Errorf("--pkcs11-pin-file %s: larger than %d bytes; it should hold only the PIN", file, maxPINFile)
	}
	pin := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if pin == "" {
		return "", fmt.Errorf("--pkcs11-pin-file %s: empty; write the token's user PIN in it", file)
	}
	return pin, nil
}

// ParseRef returns the CKA_ID a reference made by CreateKey names. It
// accepts exactly "pkcs11:id=" followed by 32 lowercase hex digits.
func ParseRef(ref string) ([]byte, error) {
	h, ok := strings.CutPrefix(ref, refPrefix)
	if !ok {
		return nil, fmt.Errorf("pkcs11: key reference %q: does not start with %q", ref, refPrefix)
	}
	if len(h) != 2*idLen || strings.ToLower(h) != h {
		return nil, fmt.Errorf("pkcs11: key reference %q: id is not %d lowercase hex digits", ref, 2*idLen)
	}
	id, err := hex.DecodeString(h)
	if err != nil {
		return nil, fmt.Errorf("pkcs11: key reference %q: id is not hex: %w", ref, err)
	}
	return id, nil
}

func formatRef(id []byte) string {
	return refPrefix + hex.EncodeToString(id)
}
