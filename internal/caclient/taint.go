package caclient

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// Bounds of the tainted authorities of one WatchBundles message.
const (
	// MaxTaintedAuthorities bounds the tainted authorities taken from one
	// message (the server sends at most as many).
	MaxTaintedAuthorities = 64
	// MaxReissueSpread bounds the re-issue spread taken from a message: a
	// server bug must not put a taint's re-issuance off for days.
	MaxReissueSpread = 24 * time.Hour
)

// TaintedAuthority is one signing authority the server's operator
// tainted: the credentials it signed must be re-issued now. Either the
// X.509 pair or JWTKeyID is set.
type TaintedAuthority struct {
	// X509SubjectKeyID is the tainted CA certificate's SubjectKeyId: an
	// X509-SVID whose AuthorityKeyId is this was signed by it.
	X509SubjectKeyID []byte
	// X509SHA256 is the SHA-256 of the tainted CA certificate's DER.
	X509SHA256 []byte
	// JWTKeyID is the kid of a tainted JWT-SVID key.
	JWTKeyID string
	// At is when it was tainted; zero when the server did not say.
	At time.Time
}

// SignedBy tells whether the X509-SVID chain (leaf first) was signed by
// one of taints: the leaf's AuthorityKeyId is a tainted SubjectKeyId, or
// a certificate of the chain is a tainted one.
func SignedBy(chain []*x509.Certificate, taints []TaintedAuthority) bool {
	if len(chain) == 0 || len(taints) == 0 {
		return false
	}
	// Each certificate hashed once, not once per taint: a node agent
	// judges a thousand chains against up to MaxTaintedAuthorities.
	sums := make([][sha256.Size]byte, len(chain))
	for i, c := range chain {
		sums[i] = sha256.Sum256(c.Raw)
	}
	for _, t := range taints {
		if len(t.X509SubjectKeyID) > 0 && bytes.Equal(chain[0].AuthorityKeyId, t.X509SubjectKeyID) {
			return true
		}
		for _, sum := range sums {
			if len(t.X509SHA256) > 0 && bytes.Equal(sum[:], t.X509SHA256) {
				return true
			}
		}
	}
	return false
}

// TaintedKeyID tells whether kid is a tainted JWT key of taints.
func TaintedKeyID(kid string, taints []TaintedAuthority) bool {
	for _, t := range taints {
		if t.JWTKeyID != "" && t.JWTKeyID == kid {
			return true
		}
	}
	return false
}

// parseTaints reads a message's tainted authorities and spread. An entry
// it cannot read is left out and named in the error, as is anything
// beyond the bounds; the rest are taken, and the bundles with them: a
// taint this client reads differently must not freeze trust updates.
func parseTaints(msg *identityapi.WatchBundlesResponse) ([]TaintedAuthority, time.Duration, error) {
	var errs []error
	in := msg.GetTaintedAuthorities()
	if len(in) > MaxTaintedAuthorities {
		errs = append(errs, fmt.Errorf("the server sent %d tainted authorities; the first %d are taken", len(in), MaxTaintedAuthorities))
		in = in[:MaxTaintedAuthorities]
	}
	var out []TaintedAuthority
	for i, ta := range in {
		t, err := parseTainted(ta)
		if err != nil {
			errs = append(errs, fmt.Errorf("the server's tainted authority %d: %w", i, err))
			continue
		}
		out = append(out, t)
	}
	spread, err := parseSpread(msg.GetReissueSpreadSeconds())
	return out, spread, errors.Join(append(errs, err)...)
}

func parseTainted(ta *identityapi.TaintedAuthority) (TaintedAuthority, error) {
	t := TaintedAuthority{JWTKeyID: ta.GetJwtKeyId()}
	if at := ta.GetTaintedAtUnix(); at > 0 {
		t.At = time.Unix(at, 0).UTC()
	}
	skid, sum := ta.GetX509SubjectKeyId(), ta.GetX509Sha256()
	switch {
	case t.JWTKeyID != "" && (skid != "" || sum != ""):
		return t, fmt.Errorf("kid %q and an X.509 certificate both named; an entry is one or the other", truncate(t.JWTKeyID, 64))
	case t.JWTKeyID != "":
		return t, nil
	case skid == "" || sum == "":
		return t, errors.New("an X.509 authority needs both its SubjectKeyId and its SHA-256")
	}
	var err error
	if t.X509SubjectKeyID, err = lowerHex(skid, 0); err != nil {
		return t, fmt.Errorf("x509_subject_key_id: %w", err)
	}
	if t.X509SHA256, err = lowerHex(sum, sha256.Size); err != nil {
		return t, fmt.Errorf("x509_sha256: %w", err)
	}
	return t, nil
}

// lowerHex decodes lowercase hex of n bytes (any length up to 64 when
// n is 0).
func lowerHex(s string, n int) ([]byte, error) {
	b, err := hex.DecodeString(s)
	switch {
	case err != nil || hex.EncodeToString(b) != s:
		return nil, fmt.Errorf("%q is not lowercase hex", truncate(s, 80))
	case n > 0 && len(b) != n:
		return nil, fmt.Errorf("%d bytes, not %d", len(b), n)
	case n == 0 && len(b) > 64:
		return nil, fmt.Errorf("%d bytes; a key identifier has at most 64", len(b))
	}
	return b, nil
}

// parseSpread is the message's spread, bounded to [0, MaxReissueSpread].
func parseSpread(secs int64) (time.Duration, error) {
	switch {
	case secs < 0:
		return 0, fmt.Errorf("the server's re-issue spread of %d seconds is negative; re-issuing at once", secs)
	case secs > int64(MaxReissueSpread/time.Second):
		return MaxReissueSpread, fmt.Errorf("the server's re-issue spread of %d seconds is over %s; taking %s", secs, MaxReissueSpread, MaxReissueSpread)
	}
	return time.Duration(secs) * time.Second, nil
}
