package authn

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/fileutil"
)

// newTokenBytes is the entropy of NewBootstrapToken: 256 bits, far out of
// reach of guessing, online or offline (a grant reference is a slow digest
// of the token's digest, shown to every TLS peer of its certificates).
const newTokenBytes = 32

// NewBootstrapToken returns a fresh random token: 32 bytes from
// crypto/rand, base64url without padding (43 characters of the RFC 6750
// b64token set).
func NewBootstrapToken() (string, error) {
	b := make([]byte, newTokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("authn: new bootstrap token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// TokenLine is one line of a bootstrap token file (TokenLineFormat).
type TokenLine struct {
	Token string
	ID    spiffeid.ID
	// Expires, when not zero, is the first instant the token no longer
	// authenticates; written in whole seconds, UTC.
	Expires  time.Time
	Reusable bool
}

// String is the line, without a newline.
func (l TokenLine) String() string {
	var b strings.Builder
	b.WriteString(l.Token)
	b.WriteByte(',')
	b.WriteString(l.ID.String())
	if !l.Expires.IsZero() {
		b.WriteString("," + optionExpires + l.Expires.UTC().Truncate(time.Second).Format(time.RFC3339))
	}
	if l.Reusable {
		b.WriteString("," + optionReusable)
	}
	return b.String()
}

// Ref is the grant reference of the line's token (BootstrapGrantRef): what
// the certificates it buys, the logs and the consumed-token ledger name it
// by.
func (l TokenLine) Ref() string {
	return BootstrapGrantRef(sha256.Sum256([]byte(l.Token)))
}

// AppendBootstrapToken adds l to the token file at path, creating it if it
// does not exist. The file is replaced atomically (a server reloading it
// sees the old content or the new, never a partial line) with mode 0600
// at most, keeping its owner (and a service's group: fileutil.Replace); a
// new file is 0600; concurrent appends are serialized by a lock on the
// file's directory, so none is lost. The existing content must load for
// l's trust domain: a file the server would refuse is not extended.
func AppendBootstrapToken(path string, l TokenLine) error {
	td := l.ID.TrustDomain()
	// The token as given, before the line's parser trims around fields:
	// the holder presents exactly these bytes.
	if err := checkBootstrapToken(l.Token); err != nil {
		return fmt.Errorf("authn: bootstrap tokens: the new line: %w", err)
	}
	if _, err := parseTokenLine(l.String(), td); err != nil {
		return fmt.Errorf("authn: bootstrap tokens: the new line: %w", err)
	}
	unlock, err := lockDir(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("authn: bootstrap tokens: %w", err)
	}
	defer unlock()
	data, _, err := readTokenFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("authn: bootstrap tokens: %w", err)
	}
	if _, err := parseBootstrapTokens(data, td); err != nil {
		return fmt.Errorf("authn: bootstrap tokens %s does not load for trust domain %s (%w); fix it first, a server would refuse it too", path, td, err)
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		data = append(data, '\n')
	}
	data = append(data, l.String()+"\n"...)
	if len(data) > MaxBootstrapFileSize {
		return fmt.Errorf("authn: bootstrap tokens %s: with the new line it would be %d bytes, more than the %d a server reads; remove the lines of consumed or expired tokens first",
			path, len(data), MaxBootstrapFileSize)
	}
	if _, err := parseBootstrapTokens(data, td); err != nil {
		return fmt.Errorf("authn: bootstrap tokens %s: with the new line: %w", path, err)
	}
	if err := fileutil.Replace(path, data, 0o600); err != nil {
		return fmt.Errorf("authn: bootstrap tokens: %w", err)
	}
	return nil
}
