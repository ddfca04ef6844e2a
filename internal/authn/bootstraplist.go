package authn

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/fileutil"
)

// TokenInfo is what a token file says of one token, without the token:
// for listing and revoking (trustbridge token list, token revoke).
type TokenInfo struct {
	// Ref is the token's grant reference (BootstrapGrantRef): what its
	// certificates, the logs and the consumed-token ledger name it by.
	Ref string
	ID  spiffeid.ID
	// Line is the token's line in the file, from 1.
	Line int
	// Expires, when not zero, is the first instant it no longer
	// authenticates.
	Expires  time.Time
	Reusable bool
}

// minRefPrefix is the shortest reference prefix RemoveBootstrapToken
// takes: 32 bits, enough to name one token of a file without a typo
// naming another.
const minRefPrefix = 8

// ListBootstrapTokens reads the token file at path as a server would, for
// the trust domain of its first token, and describes each token.
func ListBootstrapTokens(path string) ([]TokenInfo, error) {
	data, _, err := readTokenFile(path)
	if err != nil {
		return nil, fmt.Errorf("authn: bootstrap tokens: %w", err)
	}
	return describeTokens(path, data)
}

// describeTokens describes the tokens of data, the content of path.
func describeTokens(path string, data []byte) ([]TokenInfo, error) {
	set, err := parseForItsTrustDomain(data)
	if err != nil {
		return nil, fmt.Errorf("authn: bootstrap tokens %s: %w", path, err)
	}
	out := make([]TokenInfo, len(set.entries))
	for i, e := range set.entries {
		out[i] = TokenInfo{Ref: BootstrapGrantRef(e.hash), ID: e.id, Line: e.line, Expires: e.expires, Reusable: e.reusable}
	}
	return out, nil
}

// parseForItsTrustDomain parses a token file for the trust domain of its
// first token line (a file holds one trust domain's tokens).
func parseForItsTrustDomain(data []byte) (*tokenSet, error) {
	var td spiffeid.TrustDomain
	for _, line := range strings.Split(string(bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))), "\n") {
		line = strings.Trim(line, " \t\r")
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if _, rawID, ok := strings.Cut(line, ","); ok {
			rawID, _, _ = strings.Cut(rawID, ",")
			if id, err := spiffeid.FromString(strings.Trim(rawID, " \t")); err == nil {
				td = id.TrustDomain()
			}
		}
		break
	}
	if td.IsZero() {
		// The parser says what is wrong with the first line, or that
		// there is none.
		return parseBootstrapTokens(data, spiffeid.RequireTrustDomainFromString("unknown.invalid"))
	}
	return parseBootstrapTokens(data, td)
}

// RemoveBootstrapToken removes from the token file at path the line of
// the token whose reference is ref, or starts with ref (at least 8 hex
// digits, naming one token only), and returns what it removed. The file
// is read once, under the lock AppendBootstrapToken takes, and replaced
// atomically keeping its owner, group and mode (fileutil.Replace);
// comments and the other lines stay as they were.
func RemoveBootstrapToken(path, ref string) (TokenInfo, error) {
	ref = strings.ToLower(strings.TrimSpace(ref))
	if len(ref) < minRefPrefix {
		return TokenInfo{}, fmt.Errorf("authn: reference %q: give at least %d of its hex digits (trustbridge token list shows them)", ref, minRefPrefix)
	}
	unlock, err := lockDir(filepath.Dir(path))
	if err != nil {
		return TokenInfo{}, fmt.Errorf("authn: bootstrap tokens: %w", err)
	}
	defer unlock()
	data, _, err := readTokenFile(path)
	if err != nil {
		return TokenInfo{}, fmt.Errorf("authn: bootstrap tokens: %w", err)
	}
	infos, err := describeTokens(path, data)
	if err != nil {
		return TokenInfo{}, err
	}
	victim, err := pickByRef(infos, ref, path)
	if err != nil {
		return TokenInfo{}, err
	}
	lines := strings.SplitAfter(string(data), "\n")
	if victim.Line < 1 || victim.Line > len(lines) || !lineHasRef(lines[victim.Line-1], victim.Ref) {
		return TokenInfo{}, fmt.Errorf("authn: bootstrap tokens %s: line %d does not hold the token of reference %s; nothing removed", path, victim.Line, victim.Ref)
	}
	lines = append(lines[:victim.Line-1], lines[victim.Line:]...)
	if err := fileutil.Replace(path, []byte(strings.Join(lines, "")), 0o600); err != nil {
		return TokenInfo{}, fmt.Errorf("authn: bootstrap tokens: %w", err)
	}
	return victim, nil
}

// lineHasRef says whether line, one line of a token file, holds the
// token whose reference is ref.
func lineHasRef(line, ref string) bool {
	tok, _, ok := strings.Cut(strings.Trim(strings.TrimPrefix(line, "\xef\xbb\xbf"), " \t\r\n"), ",")
	return ok && TokenLine{Token: strings.Trim(tok, " \t")}.Ref() == ref
}

// pickByRef is the one token whose reference starts with ref.
func pickByRef(infos []TokenInfo, ref, path string) (TokenInfo, error) {
	var found []TokenInfo
	for _, in := range infos {
		if strings.HasPrefix(in.Ref, ref) {
			found = append(found, in)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return TokenInfo{}, fmt.Errorf("authn: no token of %s has reference %s (trustbridge token list --file %s shows them)", path, ref, path)
	}
	return TokenInfo{}, errors.New("authn: reference " + ref + " names several tokens of " + path + "; give more of its digits")
}
