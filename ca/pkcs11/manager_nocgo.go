//go:build !cgo

package pkcs11

import (
	"context"
	"crypto"
	"errors"

	"github.com/trustbridge/trustbridge/ca"
)

// errNoCgo is what every call returns in a build without cgo: PKCS#11
// modules are C libraries loaded with dlopen.
var errNoCgo = errors.New("pkcs11: this trustbridge was built without cgo, which PKCS#11 needs; build it with make build-pkcs11 (CGO_ENABLED=1)")

// Manager is the PKCS#11 key manager. In this build (no cgo) New always
// fails, so no Manager exists; the methods keep the API the same.
type Manager struct{}

var _ ca.KeyManager = (*Manager)(nil)

// New reports that PKCS#11 needs a cgo build.
func New(Config) (*Manager, error) { return nil, errNoCgo }

// CreateKey reports that PKCS#11 needs a cgo build.
func (*Manager) CreateKey(context.Context, ca.KeyType, string) (crypto.Signer, string, error) {
	return nil, "", errNoCgo
}

// FindKey reports that PKCS#11 needs a cgo build.
func (*Manager) FindKey(context.Context, string) (crypto.Signer, error) { return nil, errNoCgo }

// DestroyKey reports that PKCS#11 needs a cgo build.
func (*Manager) DestroyKey(context.Context, string) error { return errNoCgo }

// String names the manager.
func (*Manager) String() string { return "pkcs11 (not built in: no cgo)" }

// Close does nothing.
func (*Manager) Close() error { return nil }
