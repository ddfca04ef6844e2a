package bundledoc

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/pemfile"
)

// IsPEM reports whether doc is PEM rather than JSON: its first non-space
// byte starts a "-----BEGIN" line. JSON can never start so, so the choice
// is never ambiguous.
func IsPEM(doc []byte) bool {
	return bytes.HasPrefix(bytes.TrimLeft(doc, " \t\r\n"), []byte("-----BEGIN"))
}

// ParsePEM reads PEM CERTIFICATE blocks as td's X.509 authorities: what an
// Istio cacerts user holds (root-cert.pem), and what `spire-server bundle
// show -format pem` prints. Each certificate must pass the checks a bundle
// document's x5c does (a CA allowed to sign certificates, a supported key);
// one naming another trust domain in a SPIFFE URI SAN gets the warning
// CodeForeignTrustDomain, which the callers that decide trust refuse
// (federation.RefusedWarning). A PEM file carries no sequence, refresh
// hint or JWT authorities.
func ParsePEM(td spiffeid.TrustDomain, doc []byte) (*spiffebundle.Bundle, []Warning, error) {
	if td.IsZero() {
		return nil, nil, wrap(errors.New("trust domain is required"))
	}
	if len(doc) > DefaultMaxSize {
		return nil, nil, wrap(fmt.Errorf("%w: PEM larger than %d bytes", ErrTooLarge, DefaultMaxSize))
	}
	certs, err := pemfile.ParseCertificates(doc)
	if err != nil {
		return nil, nil, wrap(fmt.Errorf("PEM: %w", err))
	}
	b := spiffebundle.New(td)
	var warnings []Warning
	for i, c := range certs {
		if err := checkCA(c); err != nil {
			return nil, nil, wrap(fmt.Errorf("PEM certificate %d (%s): %w", i+1, c.Subject, err))
		}
		if err := checkKey(c.PublicKey); err != nil {
			return nil, nil, wrap(fmt.Errorf("PEM certificate %d (%s): %w", i+1, c.Subject, err))
		}
		if b.HasX509Authority(c) {
			warnings = append(warnings, Warning{Index: -1, Code: CodeDuplicateAuthority, Message: fmt.Sprintf("PEM certificate %d repeats an earlier one; ignored", i+1), Ignored: true})
			continue
		}
		if w := foreignSPIFFEID(td, c); w != "" {
			warnings = append(warnings, Warning{Index: -1, Code: CodeForeignTrustDomain, Message: fmt.Sprintf("PEM certificate %d: %s", i+1, w)})
		}
		b.AddX509Authority(c)
	}
	return b, warnings, nil
}

// ParseAny parses doc as a SPIFFE bundle document (Parse) or, when it is
// PEM (IsPEM), as PEM certificates (ParsePEM).
func ParseAny(td spiffeid.TrustDomain, doc []byte) (*spiffebundle.Bundle, []Warning, error) {
	if IsPEM(doc) {
		return ParsePEM(td, doc)
	}
	if bytes.Contains(doc, []byte("-----BEGIN ")) && !bytes.HasPrefix(bytes.TrimSpace(doc), []byte("{")) {
		// What `openssl x509 -text` prints: text, then the PEM block.
		// Not parsed as JSON, whose error would say nothing useful.
		return nil, nil, wrap(errors.New("text before the first -----BEGIN line: keep only the PEM CERTIFICATE blocks (openssl x509 -in FILE -out root-cert.pem), or give a SPIFFE bundle document"))
	}
	return Parse(td, doc)
}
