package bundleserver

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

// DefaultRefreshHint is what peers assume when a bundle carries no
// spiffe_refresh_hint (SPIFFE Federation §6.2 suggests about 5 minutes);
// the server uses it for Cache-Control in that case.
const DefaultRefreshHint = 5 * time.Minute

// maxCacheAge caps Cache-Control max-age whatever the refresh hint.
const maxCacheAge = 5 * time.Minute

// document is one rendered response body with its precomputed header
// values. It is immutable once built: requests read it through the
// server's atomic snapshot pointer and share its slices.
type document struct {
	body []byte
	// src is the bundle the source returned and bundle the one rendered
	// (src with the configured refresh hint applied, when it had none).
	// Sources publish immutable bundles, so an unchanged src pointer means
	// an unchanged document and Update can skip rendering.
	src, bundle *spiffebundle.Bundle
	// revs are the entries rendered in bundledoc.RevokedMember, as the
	// source returned them: the document is rendered again when they
	// change, even on the same bundle.
	revs   []bundledoc.Revocation
	maxAge time.Duration

	etag          string
	etagHdr       []string
	lengthHdr     []string
	cacheCtrlHdr  []string
	sequence      uint64
	hasSequence   bool
	authorityKeys int
}

func newDocument(src, b *spiffebundle.Bundle, body []byte, maxAge time.Duration) *document {
	sum := sha256.Sum256(body)
	// 128 bits of the digest: a strong validator only has to tell apart
	// versions of the same resource.
	etag := `"` + hex.EncodeToString(sum[:16]) + `"`
	d := &document{
		body:         body,
		src:          src,
		bundle:       b,
		maxAge:       maxAge,
		etag:         etag,
		etagHdr:      []string{etag},
		lengthHdr:    []string{strconv.Itoa(len(body))},
		cacheCtrlHdr: []string{"max-age=" + strconv.FormatInt(int64(maxAge/time.Second), 10)},
	}
	if b != nil {
		d.sequence, d.hasSequence = b.SequenceNumber()
		d.authorityKeys = len(b.X509Authorities()) + len(b.JWTAuthorities()) + len(b.WITAuthorities())
	}
	return d
}

// cacheAge is how long caches may keep a bundle with the given refresh
// hint: half the hint, so that a peer polling at the hint through a cache
// sees a document at most 1.5 hints old, and never more than maxCacheAge,
// which bounds how long an emergency key removal can sit in a CDN.
func cacheAge(b *spiffebundle.Bundle) time.Duration {
	hint, ok := b.RefreshHint()
	if !ok || hint <= 0 {
		hint = DefaultRefreshHint
	}
	return min(hint/2, maxCacheAge)
}

// noneMatch reports whether an If-None-Match field (all its lines) matches
// etag under the weak comparison RFC 9110 §13.1.2 prescribes: "*", or any
// listed entity tag whose opaque part equals etag's, W/ or not. A malformed
// list stops matching where it breaks, so it can only cost a full response.
func noneMatch(values []string, etag string) bool {
	for _, v := range values {
		for {
			v = strings.TrimLeft(v, " \t,")
			if v == "" {
				break
			}
			if v[0] == '*' {
				return true
			}
			v = strings.TrimPrefix(v, "W/")
			if v == "" || v[0] != '"' {
				break
			}
			end := strings.IndexByte(v[1:], '"')
			if end < 0 {
				break
			}
			if v[:end+2] == etag {
				return true
			}
			v = strings.TrimLeft(v[end+2:], " \t")
			if v != "" && v[0] != ',' {
				break
			}
		}
	}
	return false
}
