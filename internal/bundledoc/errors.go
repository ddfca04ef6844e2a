package bundledoc

import (
	"errors"
	"fmt"
	"strconv"
)

// ErrTooLarge is returned (wrapped) when a document exceeds the size cap.
var ErrTooLarge = errors.New("document too large")

// Warning reports a part of a document that was ignored because the spec
// says consumers must ignore it (unknown kty or use, empty x5c) or because it
// breaks a producer-side SHOULD that does not endanger trust. Warnings are
// returned to the caller so they can be surfaced (CLI output, status,
// metrics), not only logged.
type Warning struct {
	// TrustDomain is set for warnings inside a bundle map entry.
	TrustDomain string
	// Index is the element's position in "keys", or -1 for the document.
	Index int
	// Code classifies the warning for metrics and filtering.
	Code    WarningCode
	Message string
	// Ignored is true when the element was dropped from the bundle, false
	// when it was kept despite the warning.
	Ignored bool
}

func (w Warning) String() string {
	return prefix(w.TrustDomain, w.Index) + w.Message
}

// WarningCode classifies a Warning.
type WarningCode string

// Warning codes. They are stable: metrics and status reports use them.
const (
	CodeMissingUse         WarningCode = "missing_use"
	CodeUnknownUse         WarningCode = "unknown_use"
	CodeUnknownKty         WarningCode = "unknown_kty"
	CodeUnsupportedCurve   WarningCode = "unsupported_curve"
	CodeEmptyX5C           WarningCode = "empty_x5c"
	CodeExtraX5C           WarningCode = "extra_x5c"
	CodeKidOnX509          WarningCode = "kid_on_x509"
	CodeX5COnJWT           WarningCode = "x5c_on_jwt"
	CodeDuplicateAuthority WarningCode = "duplicate_authority"
	CodeForeignTrustDomain WarningCode = "foreign_trust_domain"
	CodeRSAInterop         WarningCode = "rsa_interop"
)

// ElementError is a fatal problem with one element of "keys".
type ElementError struct {
	Index int
	Err   error
}

func (e *ElementError) Error() string { return prefix("", e.Index) + e.Err.Error() }
func (e *ElementError) Unwrap() error { return e.Err }

// EntryError is a fatal problem with one trust domain of a bundle map.
type EntryError struct {
	TrustDomain string
	Err         error
}

func (e *EntryError) Error() string {
	return "trust_domains[" + strconv.Quote(e.TrustDomain) + "]: " + e.Err.Error()
}
func (e *EntryError) Unwrap() error { return e.Err }

func prefix(td string, index int) string {
	p := ""
	if td != "" {
		p = "trust_domains[" + strconv.Quote(td) + "]: "
	}
	if index >= 0 {
		p += fmt.Sprintf("keys[%d]: ", index)
	}
	return p
}

// Error is how this package refuses a document: its cause, prefixed
// with the package's name.
type Error struct{ Err error }

func (e *Error) Error() string { return "bundledoc: " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Cause is err without this package's prefix, for a message that names
// the document itself (a flag, a file, a configuration key), to which
// the package's name would say nothing. Other errors are returned as
// they are.
func Cause(err error) error {
	if e, ok := err.(*Error); ok {
		return e.Err
	}
	return err
}

func wrap(err error) error {
	return &Error{Err: err}
}
