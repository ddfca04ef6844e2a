package authn

import (
	"crypto/pbkdf2"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/crypto/cryptobyte"
	cbasn1 "golang.org/x/crypto/cryptobyte/asn1"
)

// GrantOID identifies the certificate extension that records the grant
// behind an X509-SVID. It is the only place the OID is defined.
//
// trustbridge has no IANA Private Enterprise Number yet; the arc is
// 1.3.6.1.4.1.32473, the number RFC 5612 reserves for documentation, with
// a trustbridge-specific tail. A collision with someone else's use of that
// arc is harmless here: the extension is read only from leaves our own CA
// signed (the X509SVID authenticator verified them against our roots and,
// with WithOwnIssuers, found our own signing certificate above them), and
// our CA never copies extensions from a CSR. Changing the OID
// later turns every existing chain into a legacy one (see GrantMethodLegacy).
var GrantOID = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 32473, 7405, 1, 1}

// GrantMethodLegacy is the method of a grant read from an X509-SVID that
// carries no grant extension: issued before grants were recorded, by
// `trustbridge ca issue`, or by SDS. Its GrantedAt is that SVID's
// NotBefore, so a bound on renewal chains still ends such a chain.
const GrantMethodLegacy = "legacy"

// GrantMethodSDS marks a certificate that SDS minted, with a key it made,
// for an Envoy that authenticated to it. Such a certificate is what Envoy
// presents to its peers, never a credential to this server: otherwise
// it would start a renewal chain of its own, unbounded, whatever became
// of the credential the Envoy authenticated with.
const GrantMethodSDS = "sds-minted"

// ErrGrantRevoked means the credential that first granted an identity (a
// bootstrap token, a service account) no longer exists, so renewals with
// certificates descended from it must stop. It is always wrapped.
var ErrGrantRevoked = errors.New("grant revoked")

// Limits of the grant extension, so that a parser never holds more than a
// few hundred bytes per certificate.
const (
	grantVersion      = 1
	maxGrantExtension = 1024
	maxGrantRef       = 317 // a namespace (63), "/" and a service account name (253)
	maxGrantUID       = 128
	bootstrapRefBytes = 16 // hex-encoded in the reference
)

// Grant is how an identity was first granted: the credential that proved
// it before any renewal. A renewal by X509-SVID copies the grant of the
// presented SVID, so every certificate of a renewal chain names the
// credential the chain started from, and the certificate service can stop
// the chain when that credential is removed.
type Grant struct {
	// Method is MethodBootstrapToken, MethodKubernetesJWT, MethodOIDC,
	// MethodKubernetesIssuer, GrantMethodLegacy or GrantMethodSDS; never
	// MethodX509SVID.
	Method string
	// Ref names the credential. Bootstrap: BootstrapGrantRef of the token
	// (a slow digest of its digest, never the token). Kubernetes: the service
	// account as "<namespace>/<name>". OIDC and Kubernetes issuers: the
	// issuer's configured name (CheckIssuerName). Legacy: empty.
	Ref string
	// UID is the Kubernetes service account's UID, which tells a
	// re-created account of the same name from the original (empty when
	// the API server did not report one); for OIDC and Kubernetes issuers,
	// IssuerGrantUID of the issuer URL; empty for other methods.
	UID string
	// GrantedAt is when the grant was first used to issue a certificate.
	// Token authenticators leave it zero; the certificate service sets it
	// on issuance.
	GrantedAt time.Time
}

// grantASN1 is the extension's DER form:
//
//	TrustbridgeGrant ::= SEQUENCE {
//	    version    INTEGER,          -- 1
//	    method     UTF8String,
//	    reference  UTF8String,
//	    uid        UTF8String,       -- "" when not applicable
//	    grantedAt  GeneralizedTime   -- whole seconds, UTC
//	}
type grantASN1 struct {
	Version   int
	Method    string    `asn1:"utf8"`
	Ref       string    `asn1:"utf8"`
	UID       string    `asn1:"utf8"`
	GrantedAt time.Time `asn1:"generalized"`
}

// Extension encodes g as a non-critical certificate extension. Verifiers
// that do not know the OID ignore it, which is why it must not be critical.
func (g Grant) Extension() (pkix.Extension, error) {
	g.GrantedAt = g.GrantedAt.UTC().Truncate(time.Second)
	if err := g.check(); err != nil {
		return pkix.Extension{}, fmt.Errorf("authn: grant: %w", err)
	}
	der, err := g.marshal()
	if err != nil {
		return pkix.Extension{}, fmt.Errorf("authn: grant: %w", err)
	}
	return pkix.Extension{Id: GrantOID, Critical: false, Value: der}, nil
}

// marshal is grantASN1's DER for g, checked: what encoding/asn1's
// Marshal writes for it (TestGrantMarshalMatchesEncodingASN1), built with
// cryptobyte, as crypto/x509 builds certificates: encoding/asn1's
// reflection cost 2 µs and 21 allocations a certificate, 1.4% of the
// server's CPU an X509-SVID at 8 clients.
func (g Grant) marshal() ([]byte, error) {
	b := cryptobyte.NewBuilder(make([]byte, 0, 64+len(g.Method)+len(g.Ref)+len(g.UID)))
	b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		b.AddASN1Int64(grantVersion)
		for _, v := range []string{g.Method, g.Ref, g.UID} {
			b.AddASN1(cbasn1.UTF8String, func(b *cryptobyte.Builder) { b.AddBytes([]byte(v)) })
		}
		b.AddASN1GeneralizedTime(g.GrantedAt)
	})
	return b.Bytes()
}

// ParseGrant decodes the value of a GrantOID extension. It accepts exactly
// what Extension writes: one DER value of version 1 with a known method and
// a reference of that method's shape.
func ParseGrant(der []byte) (Grant, error) {
	if len(der) > maxGrantExtension {
		return Grant{}, fmt.Errorf("authn: grant: %d bytes, more than %d", len(der), maxGrantExtension)
	}
	var v grantASN1
	rest, err := asn1.Unmarshal(der, &v)
	if err != nil {
		return Grant{}, fmt.Errorf("authn: grant: %w", err)
	}
	if len(rest) > 0 {
		return Grant{}, fmt.Errorf("authn: grant: %d bytes after the value", len(rest))
	}
	if v.Version != grantVersion {
		return Grant{}, fmt.Errorf("authn: grant: version %d, want %d", v.Version, grantVersion)
	}
	g := Grant{Method: v.Method, Ref: v.Ref, UID: v.UID, GrantedAt: v.GrantedAt.UTC()}
	if err := g.check(); err != nil {
		return Grant{}, fmt.Errorf("authn: grant: %w", err)
	}
	return g, nil
}

// check applies the shape rules shared by Extension and ParseGrant: those
// of every grant, then those of its method.
func (g Grant) check() error {
	if !utf8.ValidString(g.Ref) || !utf8.ValidString(g.UID) {
		return errors.New("reference or uid is not UTF-8")
	}
	if len(g.UID) > maxGrantUID {
		return fmt.Errorf("uid is %d bytes, more than %d", len(g.UID), maxGrantUID)
	}
	if g.GrantedAt.IsZero() {
		return errors.New("no grant time")
	}
	switch g.Method {
	case MethodBootstrapToken:
		return g.checkBootstrap()
	case MethodKubernetesJWT:
		return g.checkServiceAccount()
	case MethodOIDC, MethodKubernetesIssuer:
		return g.checkIssuer()
	case GrantMethodLegacy, GrantMethodSDS:
		return g.checkBare()
	default:
		return fmt.Errorf("unknown method %q", truncate(g.Method, 64))
	}
}

// checkBootstrap checks a bootstrap token grant: its reference names the
// token (lowercase hex) and it has no uid.
func (g Grant) checkBootstrap() error {
	if !isLowerHex(g.Ref, 2*bootstrapRefBytes) {
		return fmt.Errorf("bootstrap reference %q is not %d lowercase hex digits", g.Ref, 2*bootstrapRefBytes)
	}
	if g.UID != "" {
		return errors.New("bootstrap grant has a uid")
	}
	return nil
}

// checkServiceAccount checks a Kubernetes JWT grant: its reference is a
// bounded namespace/name service account reference.
func (g Grant) checkServiceAccount() error {
	if len(g.Ref) > maxGrantRef {
		return fmt.Errorf("service account reference is %d bytes, more than %d", len(g.Ref), maxGrantRef)
	}
	_, _, err := SplitServiceAccountRef(g.Ref)
	return err
}

// checkIssuer checks an OIDC or Kubernetes issuer grant: its reference is
// an issuer name and its uid the IssuerGrantUID of the issuer URL.
func (g Grant) checkIssuer() error {
	if !validIssuerName(g.Ref) {
		return fmt.Errorf("issuer reference %q is not an issuer name (1 to %d of a-z, 0-9 and -)", truncate(g.Ref, 64), MaxIssuerNameLen)
	}
	if !isLowerHex(g.UID, 2*issuerUIDBytes) {
		return fmt.Errorf("%s grant uid %q is not %d lowercase hex digits (IssuerGrantUID of the issuer URL)", g.Method, truncate(g.UID, 64), 2*issuerUIDBytes)
	}
	return nil
}

// checkBare checks a legacy or SDS grant, which carries neither reference
// nor uid.
func (g Grant) checkBare() error {
	if g.Ref != "" || g.UID != "" {
		return fmt.Errorf("%s grant has a reference or uid", g.Method)
	}
	return nil
}

// isLowerHex reports whether s is exactly n lowercase hex digits.
func isLowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// issuerUIDBytes is how much of the issuer URL's SHA-256 a grant keeps.
const issuerUIDBytes = 16

// IssuerGrantUID is the grant UID of an identity an OIDC or Kubernetes
// issuer granted (MethodOIDC, MethodKubernetesIssuer): the first 16
// bytes of the SHA-256 of the issuer URL, in lowercase hex. The grant's
// reference is only the issuer's configured name; the UID ties a renewal
// chain to the URL too, so pointing that name at another issuer ends the
// chains the old one started.
func IssuerGrantUID(issuerURL string) string {
	sum := sha256.Sum256([]byte(issuerURL))
	return hex.EncodeToString(sum[:issuerUIDBytes])
}

// MaxIssuerNameLen bounds an OIDC issuer's configured name, which is its
// grant reference and metric label.
const MaxIssuerNameLen = 63

// validIssuerName reports whether s is an issuer name: a DNS label's
// characters (lowercase letters, digits, '-', not at either end).
func validIssuerName(s string) bool {
	if s == "" || len(s) > MaxIssuerNameLen || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// CheckIssuerName returns an error saying what is wrong with an OIDC
// issuer name, nil for a good one.
func CheckIssuerName(s string) error {
	if !validIssuerName(s) {
		return fmt.Errorf("issuer name %q must be 1 to %d lowercase letters, digits and '-' (not first or last)", truncate(s, 64), MaxIssuerNameLen)
	}
	return nil
}

// SplitServiceAccountRef splits a Kubernetes grant reference
// "<namespace>/<name>".
func SplitServiceAccountRef(ref string) (namespace, name string, err error) {
	ns, sa, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || sa == "" || strings.Contains(sa, "/") {
		return "", "", fmt.Errorf("service account reference %q is not <namespace>/<name>", truncate(ref, 64))
	}
	return ns, sa, nil
}

// bootstrapRefIterations is the PBKDF2 work per reference: about 3 ms of
// one core. Certificates are shown to every TLS peer, so a reference must
// not make a guessable token cheap to guess offline; tokens are meant to be
// random (and then no work factor matters), this protects the ones that
// are not. References are computed once per token and kept across reloads.
const bootstrapRefIterations = 20000

// BootstrapGrantRef is the grant reference of the bootstrap token whose
// SHA-256 is tokenDigest: 16 bytes of PBKDF2-HMAC-SHA-256 over that digest,
// hex-encoded. It never reveals the token nor the digest the token file is
// matched by, and it is slow to compute (see bootstrapRefIterations);
// it still lets an operator match a chain to a token line and lets the
// service tell whether the token is still listed.
func BootstrapGrantRef(tokenDigest [32]byte) string {
	ref, err := pbkdf2.Key(sha256.New, string(tokenDigest[:]), []byte("trustbridge bootstrap grant v1"), bootstrapRefIterations, bootstrapRefBytes)
	if err != nil {
		// Only a FIPS 140-3 mode refusing these parameters fails, and
		// neither the salt nor the key length changes at run time.
		panic(fmt.Sprintf("authn: bootstrap grant reference: %v", err))
	}
	return hex.EncodeToString(ref)
}

// GrantFromCert returns the grant recorded in cert. A certificate without
// the extension yields a GrantMethodLegacy grant dated at its NotBefore; an
// extension that does not parse is an error. (x509.ParseCertificate already
// refuses a certificate that repeats an extension.) Only call it on a
// certificate our own CA signed, in a chain that verified against the
// local roots: anyone can write the extension into a certificate of their
// own, and so can any other CA those roots trust (a downstream's
// intermediate).
func GrantFromCert(cert *x509.Certificate) (Grant, error) {
	for _, e := range cert.Extensions {
		if e.Id.Equal(GrantOID) {
			return ParseGrant(e.Value)
		}
	}
	return Grant{Method: GrantMethodLegacy, GrantedAt: cert.NotBefore.UTC()}, nil
}

// svidIdentity is the Identity of a verified X509-SVID leaf: its ID, the
// grant it carries and its NotAfter. A grant that does not parse is reported in GrantErr
// rather than failing authentication, so the certificate service can
// refuse renewal with a clear reason while SDS, which does not renew
// chains, keeps working.
//
// grant is what readLeafGrant found in leaf, kept with the verification.
func svidIdentity(id spiffeid.ID, leaf *x509.Certificate, grant leafGrant) Identity {
	if grant.err != nil {
		return Identity{ID: id, Method: MethodX509SVID, GrantErr: grant.err, NotAfter: leaf.NotAfter}
	}
	g := grant.grant // each Identity its own copy
	return Identity{ID: id, Method: MethodX509SVID, Grant: &g, NotAfter: leaf.NotAfter}
}
