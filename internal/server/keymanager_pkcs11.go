package server

import (
	"fmt"
	"log/slog"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/pkcs11"
)

func init() { openPKCS11 = openPKCS11Token }

// openPKCS11Token logs in to the token the flags name.
func openPKCS11Token(o KeyManagerConfig, getenv func(string) string, logger *slog.Logger) (ca.KeyManager, func(), error) {
	pin, err := pkcs11.ReadPIN(o.pinFile, getenv)
	if err != nil {
		return nil, nil, fmt.Errorf("--key-manager pkcs11: %w", err)
	}
	var slot *int
	if o.slot >= 0 {
		s := o.slot
		slot = &s
	}
	m, err := pkcs11.New(pkcs11.Config{Module: o.module, TokenLabel: o.tokenLabel, Slot: slot, PIN: pin, Logger: logger})
	if err != nil {
		return nil, nil, fmt.Errorf("--key-manager pkcs11: %w", err)
	}
	return m, func() { _ = m.Close() }, nil
}
