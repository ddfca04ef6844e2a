package bundledoc

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// DefaultMaxSize caps documents read through Read and ReadMap when the
// caller passes no limit. Real bundles are a few KiB; a relay's bundle map
// with hundreds of trust domains stays well under this.
const DefaultMaxSize = 1 << 20

// Key uses defined by the SVID specifications. wit-svid is not in the
// Trust Domain and Bundle spec, but SPIRE and go-spiffe publish it and
// go-spiffe's bundle model holds it, so a relay must carry it through.
const (
	UseX509SVID = "x509-svid"
	UseJWTSVID  = "jwt-svid"
	UseWITSVID  = "wit-svid"
)

// RSA key sizes accepted for authorities. Under 2048 bits is breakable;
// over 8192 is a cheap way to make every verification expensive.
const (
	MinRSABits = 2048
	MaxRSABits = 8192
)

// goJoseMaxRSABits is go-jose's default MaxRSAModulusBits, which go-spiffe
// and SPIRE inherit.
const goJoseMaxRSABits = 4096

// maxRefreshHintSeconds keeps the hint representable as a time.Duration.
const maxRefreshHintSeconds = math.MaxInt64 / int64(time.Second)

// jwkMembers are the JWK member names we read or refuse.
var jwkMembers = []string{"use", "kty", "kid", "crv", "x", "y", "n", "e", "x5c", "d", "p", "q", "dp", "dq", "qi", "oth", "k", "priv"}

// Members of a JWK that carry private or symmetric key material. A bundle
// holding any of them leaks a key; refuse it outright.
var privateMembers = []string{"d", "p", "q", "dp", "dq", "qi", "oth", "k", "priv"}

// Parse parses a SPIFFE bundle document for the trust domain td.
//
// It is tolerant where the spec says consumers must ignore (unknown kty or
// use, missing use, unsupported curve, x509-svid entries without x5c): such
// elements are skipped and reported as warnings. It is strict where the
// spec says must, and everywhere a lenient reading could widen trust.
func Parse(td spiffeid.TrustDomain, doc []byte) (*spiffebundle.Bundle, []Warning, error) {
	if td.IsZero() {
		return nil, nil, wrap(errors.New("trust domain is required"))
	}
	if err := checkStrict(doc); err != nil {
		return nil, nil, wrap(err)
	}
	members, err := decodeObject(doc, "bundle document")
	if err != nil {
		return nil, nil, wrap(err)
	}
	b, warnings, err := parseBundle(td, members, false)
	if err != nil {
		return nil, nil, wrap(err)
	}
	return b, warnings, nil
}

// Read reads at most limit bytes from r (DefaultMaxSize when limit <= 0)
// and parses them as Parse does. A larger document is an error wrapping
// ErrTooLarge: a truncated bundle must never be mistaken for a smaller one.
func Read(td spiffeid.TrustDomain, r io.Reader, limit int64) (*spiffebundle.Bundle, []Warning, error) {
	doc, err := ReadLimited(r, limit)
	if err != nil {
		return nil, nil, err
	}
	return Parse(td, doc)
}

// ReadLimited reads all of r, failing with ErrTooLarge past limit bytes
// (DefaultMaxSize when limit <= 0).
func ReadLimited(r io.Reader, limit int64) ([]byte, error) {
	if limit <= 0 {
		limit = DefaultMaxSize
	}
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, wrap(fmt.Errorf("read document: %w", err))
	}
	if int64(len(data)) > limit {
		return nil, wrap(fmt.Errorf("%w: more than %d bytes", ErrTooLarge, limit))
	}
	return data, nil
}

func decodeObject(raw []byte, what string) (map[string]json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return nil, fmt.Errorf("%s must be a JSON object, got %s", what, jsonKind(raw))
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return m, nil
}

// parseBundle builds a bundle from the members of a bundle document. Member
// lookups are exact: encoding/json matches struct fields case-insensitively,
// which would let "KEYS" stand in for "keys".
func parseBundle(td spiffeid.TrustDomain, doc map[string]json.RawMessage, inMap bool) (*spiffebundle.Bundle, []Warning, error) {
	if err := checkMemberNames(doc, "keys", "spiffe_sequence", "spiffe_refresh_hint", "trust_domains"); err != nil {
		return nil, nil, err
	}
	elements, err := keyElements(doc, inMap)
	if err != nil {
		return nil, nil, err
	}
	b := spiffebundle.New(td)
	if err := setBundleMetadata(b, doc, inMap); err != nil {
		return nil, nil, err
	}
	warnings, err := addAuthorities(td, b, elements)
	if err != nil {
		return nil, nil, err
	}
	return b, warnings, nil
}

// keyElements returns the raw elements of the document's "keys" array,
// which is required.
func keyElements(doc map[string]json.RawMessage, inMap bool) ([]json.RawMessage, error) {
	rawKeys, ok := doc["keys"]
	if !ok {
		if _, isMap := doc["trust_domains"]; isMap && !inMap {
			return nil, errors.New(`missing "keys" (this is a SPIFFE bundle map, not a bundle)`)
		}
		return nil, errors.New(`missing "keys"`)
	}
	if kind := jsonKind(rawKeys); kind != "an array" {
		return nil, fmt.Errorf(`"keys" must be an array, got %s`, kind)
	}
	var elements []json.RawMessage
	if err := json.Unmarshal(rawKeys, &elements); err != nil {
		return nil, fmt.Errorf(`"keys": %w`, err)
	}
	return elements, nil
}

// setBundleMetadata sets b's sequence number and refresh hint from the
// document's optional spiffe_sequence and spiffe_refresh_hint members.
func setBundleMetadata(b *spiffebundle.Bundle, doc map[string]json.RawMessage, inMap bool) error {
	if raw, ok := doc["spiffe_sequence"]; ok {
		seq, err := parseUint(raw, "spiffe_sequence", "an unsigned 64-bit integer")
		if err != nil {
			return err
		}
		b.SetSequenceNumber(seq)
	}
	// Refresh hints inside a bundle map must not be used by consumers
	// (Trust Domain and Bundle spec §5.1.1), so they are not even read.
	if raw, ok := doc["spiffe_refresh_hint"]; ok && !inMap {
		hint, err := parseUint(raw, "spiffe_refresh_hint", "a non-negative integer number of seconds")
		if err != nil {
			return err
		}
		if hint > uint64(maxRefreshHintSeconds) {
			return fmt.Errorf("spiffe_refresh_hint %d seconds is too large", hint)
		}
		b.SetRefreshHint(time.Duration(hint) * time.Second)
	}
	return nil
}

// addAuthorities parses the elements of "keys" in order and adds their
// authorities to b, skipping the elements the spec says to ignore. It
// returns the warnings about them, each with its element's index.
func addAuthorities(td spiffeid.TrustDomain, b *spiffebundle.Bundle, elements []json.RawMessage) ([]Warning, error) {
	var warnings []Warning
	jwtKids := map[string]int{} // kid → index of its element
	witKids := map[string]int{}
	for i, raw := range elements {
		k, warns, err := parseKey(raw)
		for _, w := range warns {
			warnings = append(warnings, Warning{Index: i, Code: w.code, Message: w.msg, Ignored: k == nil && err == nil})
		}
		if err != nil {
			return nil, &ElementError{Index: i, Err: err}
		}
		if k == nil {
			continue
		}
		switch k.use {
		case UseX509SVID:
			warnings = addX509Authority(td, b, i, k, warnings)
		case UseJWTSVID:
			err = addJWTAuthority(b.AddJWTAuthority, jwtKids, i, k)
		case UseWITSVID:
			err = addJWTAuthority(b.AddWITAuthority, witKids, i, k)
		}
		if err != nil {
			return nil, err
		}
	}
	return warnings, nil
}

// addX509Authority adds the x509-svid authority of element i to b and
// returns warnings with those about it appended: a duplicate root is
// ignored, a root naming another trust domain than td is kept.
func addX509Authority(td spiffeid.TrustDomain, b *spiffebundle.Bundle, i int, k *key, warnings []Warning) []Warning {
	if b.HasX509Authority(k.cert) {
		return append(warnings, Warning{Index: i, Code: CodeDuplicateAuthority, Message: "duplicate x509-svid authority; ignored", Ignored: true})
	}
	if w := foreignSPIFFEID(td, k.cert); w != "" {
		warnings = append(warnings, Warning{Index: i, Code: CodeForeignTrustDomain, Message: w})
	}
	b.AddX509Authority(k.cert)
	return warnings
}

// addJWTAuthority adds the jwt-svid or wit-svid authority of element i
// with add. kids holds the kids already taken for that use, each with its
// element's index: a kid used twice is an error, as consumers could pick
// either key.
func addJWTAuthority(add func(string, crypto.PublicKey) error, kids map[string]int, i int, k *key) error {
	if prev, dup := kids[k.kid]; dup {
		return &ElementError{Index: i, Err: fmt.Errorf("duplicate kid %q (also keys[%d])", k.kid, prev)}
	}
	kids[k.kid] = i
	if err := add(k.kid, k.pub); err != nil {
		return &ElementError{Index: i, Err: err}
	}
	return nil
}

func parseUint(raw json.RawMessage, name, want string) (uint64, error) {
	if !isUnsignedInteger(raw) {
		return 0, fmt.Errorf("%s must be %s, got %s", name, want, clip(raw))
	}
	v, err := strconv.ParseUint(string(raw), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s must be %s, got %s (out of range)", name, want, clip(raw))
	}
	return v, nil
}

// clip shortens raw input quoted in error messages.
func clip(raw json.RawMessage) string {
	const max = 40
	if len(raw) > max {
		return string(raw[:max]) + "…"
	}
	return string(raw)
}

// note is a warning about the element being parsed.
type note struct {
	code WarningCode
	msg  string
}

// key is one accepted element of "keys".
type key struct {
	use  string
	kid  string
	pub  crypto.PublicKey
	cert *x509.Certificate // x509-svid only
}

// parseKey decodes one JWK element. It returns (nil, warnings, nil) for an
// element the spec says to ignore.
func parseKey(raw json.RawMessage) (*key, []note, error) {
	m, use, ignored, err := keyHeader(raw)
	if err != nil || ignored != nil {
		return nil, ignored, err
	}
	pub, ignored, err := keyMaterial(m)
	if err != nil || ignored != nil {
		return nil, ignored, err
	}
	kid, hasKid, err := stringMember(m, "kid")
	if err != nil {
		return nil, nil, err
	}
	k := &key{use: use, pub: pub}
	var warnings []note
	if rk, ok := pub.(*rsa.PublicKey); ok && rk.N.BitLen() > goJoseMaxRSABits {
		warnings = append(warnings, note{CodeRSAInterop, fmt.Sprintf("RSA key of %d bits: go-spiffe and SPIRE refuse keys over %d bits, so their consumers will reject a bundle holding it", rk.N.BitLen(), goJoseMaxRSABits)})
	}
	if use != UseX509SVID {
		if !hasKid || kid == "" {
			return nil, nil, fmt.Errorf("%s element has no kid", use)
		}
		k.kid = kid
		if _, ok := m["x5c"]; ok {
			warnings = append(warnings, note{CodeX5COnJWT, fmt.Sprintf("x5c on a %s element is ignored", use)})
		}
		return k, warnings, nil
	}
	if hasKid {
		warnings = append(warnings, note{CodeKidOnX509, "kid must not be set on an x509-svid element; ignored"})
	}
	cert, notes, err := x5cCert(m, pub)
	warnings = append(warnings, notes...)
	if err != nil {
		return nil, nil, err
	}
	if cert == nil {
		return nil, warnings, nil
	}
	k.cert = cert
	return k, warnings, nil
}

// keyHeader decodes an element's members and judges its use. ignored is
// set for an element the spec says to ignore (no use, or one we do not
// support); published private key material is an error.
func keyHeader(raw json.RawMessage) (m map[string]json.RawMessage, use string, ignored []note, err error) {
	m, err = decodeObject(raw, "element")
	if err != nil {
		return nil, "", nil, err
	}
	if err := checkMemberNames(m, jwkMembers...); err != nil {
		return nil, "", nil, err
	}
	use, present, err := stringMember(m, "use")
	if err != nil {
		return nil, "", nil, err
	}
	if !present {
		return nil, "", []note{{CodeMissingUse, `missing "use"; element ignored`}}, nil
	}
	switch use {
	case UseX509SVID, UseJWTSVID, UseWITSVID:
	default:
		return nil, "", []note{{CodeUnknownUse, fmt.Sprintf("use %q is not supported; element ignored", use)}}, nil
	}
	// A published private or symmetric key is a leak whatever its type,
	// and go-spiffe would even take an "oct" key as a JWT authority.
	for _, name := range privateMembers {
		if _, ok := m[name]; ok {
			return nil, "", nil, fmt.Errorf("element contains private key material (%q); the publisher's key is exposed", name)
		}
	}
	return m, use, nil, nil
}

// keyMaterial decodes and checks an element's public key. ignored is set
// for a key type or curve we do not support.
func keyMaterial(m map[string]json.RawMessage) (pub crypto.PublicKey, ignored []note, err error) {
	kty, present, err := stringMember(m, "kty")
	if err != nil {
		return nil, nil, err
	}
	if !present || kty == "" {
		// Trust Domain and Bundle §4.2.1: kty MUST be set. Unlike an
		// unknown kty, a missing one is a malformed document.
		return nil, nil, errors.New(`missing "kty"`)
	}
	crv, _, err := stringMember(m, "crv")
	if err != nil {
		return nil, nil, err
	}
	// Only the members of the key types we support are handed to go-jose,
	// under their exact names. Everything else is dropped, so neither
	// go-jose's case-insensitive field matching nor its private-key and
	// x5c handling can see anything we did not check.
	var want []string
	switch kty {
	case "EC":
		switch crv {
		case "P-256", "P-384", "P-521":
		default:
			return nil, []note{{CodeUnsupportedCurve, fmt.Sprintf("EC curve %q is not supported; element ignored", crv)}}, nil
		}
		want = []string{"kty", "crv", "x", "y"}
	case "RSA":
	case "OKP":
		if crv != "Ed25519" {
			return nil, []note{{CodeUnsupportedCurve, fmt.Sprintf("OKP curve %q is not supported; element ignored", crv)}}, nil
		}
		want = []string{"kty", "crv", "x"}
	default:
		return nil, []note{{CodeUnknownKty, fmt.Sprintf("kty %q is not supported; element ignored", kty)}}, nil
	}
	if kty == "RSA" {
		pub, err = decodeRSA(m)
	} else {
		pub, err = decodePublicKey(m, want)
	}
	if err != nil {
		return nil, nil, err
	}
	if err := checkKey(pub); err != nil {
		return nil, nil, err
	}
	return pub, nil, nil
}

// x5cCert decodes an x509-svid element's certificate, which must be a CA
// holding the element's key pub. A nil certificate without an error means
// the element is ignored, as the notes say.
func x5cCert(m map[string]json.RawMessage, pub crypto.PublicKey) (*x509.Certificate, []note, error) {
	var x5c []string
	if raw, ok := m["x5c"]; ok && jsonKind(raw) != "null" {
		if err := json.Unmarshal(raw, &x5c); err != nil {
			return nil, nil, fmt.Errorf("x5c must be an array of strings, got %s", jsonKind(raw))
		}
	}
	if len(x5c) == 0 {
		return nil, []note{{CodeEmptyX5C, "x509-svid element has no x5c certificate; element ignored"}}, nil
	}
	var notes []note
	if len(x5c) > 1 {
		notes = append(notes, note{CodeExtraX5C, fmt.Sprintf("x5c holds %d certificates; only the first is used", len(x5c))})
	}
	// RFC 7517 §4.7: standard base64, not base64url. Go's decoder skips
	// \r and \n, which have no place in a JSON string value here.
	if strings.ContainsAny(x5c[0], "\r\n") {
		return nil, nil, errors.New("x5c[0] is not standard base64: contains a line break")
	}
	der, err := base64.StdEncoding.Strict().DecodeString(x5c[0])
	if err != nil {
		return nil, nil, fmt.Errorf("x5c[0] is not standard base64: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("x5c[0] is not a valid certificate: %w", err)
	}
	if err := checkCA(cert); err != nil {
		return nil, nil, err
	}
	if !publicKeysEqual(pub, cert.PublicKey) {
		return nil, nil, errors.New("x5c certificate public key does not match the JWK key")
	}
	return cert, notes, nil
}

// stringMember returns a member that must be a JSON string when present.
func stringMember(m map[string]json.RawMessage, name string) (string, bool, error) {
	raw, ok := m[name]
	if !ok {
		return "", false, nil
	}
	if kind := jsonKind(raw); kind != "a string" {
		return "", true, fmt.Errorf("%q must be a string, got %s", name, kind)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", true, fmt.Errorf("%q: %w", name, err)
	}
	return s, true, nil
}

func decodePublicKey(m map[string]json.RawMessage, want []string) (crypto.PublicKey, error) {
	canon := make(map[string]json.RawMessage, len(want))
	for _, name := range want {
		if raw, ok := m[name]; ok {
			canon[name] = raw
		}
	}
	data, err := json.Marshal(canon)
	if err != nil {
		return nil, fmt.Errorf("invalid JWK: %w", err)
	}
	var jwk jose.JSONWebKey
	if err := jwk.UnmarshalJSON(data); err != nil {
		return nil, fmt.Errorf("invalid JWK: %w", err)
	}
	if !jwk.IsPublic() {
		return nil, errors.New("invalid JWK: not a public key")
	}
	return jwk.Key, nil
}

// decodeRSA decodes an RSA public JWK (RFC 7518 §6.3.1). go-jose refuses
// moduli over its process-wide MaxRSAModulusBits (4096), and changing that
// global would change it for every go-jose user in the process, so the two
// integers are decoded here. The length is checked before any big.Int is
// built.
func decodeRSA(m map[string]json.RawMessage) (*rsa.PublicKey, error) {
	n, err := base64urlMember(m, "n")
	if err != nil {
		return nil, err
	}
	e, err := base64urlMember(m, "e")
	if err != nil {
		return nil, err
	}
	n = bytes.TrimLeft(n, "\x00")
	if bits := len(n) * 8; bits > MaxRSABits+8 {
		return nil, fmt.Errorf("RSA key of about %d bits is outside the accepted %d–%d", bits, MinRSABits, MaxRSABits)
	}
	e = bytes.TrimLeft(e, "\x00")
	if len(e) == 0 || len(e) > 4 {
		return nil, errors.New("invalid JWK: RSA exponent must be 1 to 4 bytes")
	}
	var exp int64
	for _, c := range e {
		exp = exp<<8 | int64(c)
	}
	if exp > math.MaxInt32 {
		return nil, fmt.Errorf("RSA public exponent %d is invalid", exp)
	}
	return &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(exp)}, nil
}

// base64urlMember decodes a required base64url member (RFC 7518 §2:
// unpadded).
func base64urlMember(m map[string]json.RawMessage, name string) ([]byte, error) {
	s, ok, err := stringMember(m, name)
	if err != nil {
		return nil, err
	}
	if !ok || s == "" {
		return nil, fmt.Errorf("invalid JWK: RSA key is missing %q", name)
	}
	// Go's decoders skip \r and \n; nothing but the base64url alphabet
	// belongs here.
	if strings.ContainsAny(s, "=\r\n") {
		return nil, fmt.Errorf("invalid JWK: %q is not unpadded base64url", name)
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("invalid JWK: %q is not base64url: %w", name, err)
	}
	return b, nil
}

// checkKey enforces the key shapes trustbridge accepts as authorities.
func checkKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		bits := k.N.BitLen()
		if bits < MinRSABits || bits > MaxRSABits {
			return fmt.Errorf("RSA key of %d bits is outside the accepted %d–%d", bits, MinRSABits, MaxRSABits)
		}
		if k.E < 3 || k.E%2 == 0 {
			return fmt.Errorf("RSA public exponent %d is invalid", k.E)
		}
	case *ecdsa.PublicKey:
		switch k.Curve.Params().Name {
		case "P-256", "P-384", "P-521":
		default:
			return fmt.Errorf("EC curve %s is not supported", k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return errors.New("Ed25519 key has the wrong length")
		}
	default:
		return fmt.Errorf("key type %T is not supported", pub)
	}
	return nil
}

// checkCA applies X509-SVID §4.1 / §6 to a bundle authority: it must be a
// CA certificate allowed to sign certificates.
func checkCA(cert *x509.Certificate) error {
	if !cert.BasicConstraintsValid || !cert.IsCA {
		return errors.New("x5c certificate is not a CA (basicConstraints CA=true required)")
	}
	if cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return errors.New("x5c certificate is not a CA (keyUsage keyCertSign required)")
	}
	return nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}

// foreignSPIFFEID warns when a root names another trust domain in its URI
// SAN: the bundle was probably published or configured for the wrong trust
// domain. The root still only ever verifies SVIDs of td.
func foreignSPIFFEID(td spiffeid.TrustDomain, cert *x509.Certificate) string {
	for _, u := range cert.URIs {
		if u.Scheme != "spiffe" {
			continue
		}
		id, err := spiffeid.FromURI(u)
		if err != nil || id.TrustDomain() == td {
			continue
		}
		return fmt.Sprintf("x5c certificate names trust domain %q but the bundle is for %q", id.TrustDomain().Name(), td.Name())
	}
	return ""
}
