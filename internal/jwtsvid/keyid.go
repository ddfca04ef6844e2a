package jwtsvid

import (
	"encoding/base64"
	"encoding/json"
	"strings"
)

// maxHeader bounds the header read for its kid: a JWT-SVID's is a few
// dozen bytes.
const maxHeader = 4096

// KeyID is the kid of a compact JWS's protected header, "" when it has
// none or the token does not parse. It reads the header only, checking
// nothing: for a token this process minted or received from its own
// server (a taint names the kid to drop; the issuance ledger counts by
// kid), never to decide whether to trust one.
func KeyID(token string) string {
	head, _, ok := strings.Cut(token, ".")
	if !ok || len(head) > maxHeader {
		return ""
	}
	raw, err := base64.RawURLEncoding.DecodeString(head)
	if err != nil {
		return ""
	}
	var h struct {
		KeyID string `json:"kid"`
	}
	if json.Unmarshal(raw, &h) != nil {
		return ""
	}
	return h.KeyID
}
