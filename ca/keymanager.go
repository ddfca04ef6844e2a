package ca

import (
	"context"
	"crypto"
	"errors"
)

// ErrKeyNotFound is returned by a KeyManager asked for a key it does not
// hold (a wrong token, a key deleted by hand).
var ErrKeyNotFound = errors.New("signing key not found")

// KeyManager keeps the CA's signing keys (roots, intermediates, JWT-SVID
// keys) outside the state backend: in an HSM through PKCS#11, or in a
// cloud KMS. Keys are generated inside the manager and never leave it; the
// journal records only the reference that finds a key again, which is
// not secret. nil (Config.Keys) keeps keys in the state itself: PEM files
// (0600) in --data-dir, or the state Secret with --storage kube.
//
// A manager may also implement fmt.Stringer, naming where its keys live
// for messages ("pkcs11 token \"trustbridge\" (libsofthsm2.so)").
type KeyManager interface {
	// CreateKey generates a key of type kt inside the manager, labelled
	// label (unique per key, for operators reading the token), and
	// returns it with the reference that finds it again.
	CreateKey(ctx context.Context, kt KeyType, label string) (key crypto.Signer, ref string, err error)
	// FindKey returns the key ref names, or an error wrapping
	// ErrKeyNotFound.
	FindKey(ctx context.Context, ref string) (crypto.Signer, error)
	// DestroyKey deletes the key ref names, once no published root,
	// intermediate or JWT key needs it. A key already gone is not an
	// error.
	DestroyKey(ctx context.Context, ref string) error
}
