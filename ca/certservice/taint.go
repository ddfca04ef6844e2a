package certservice

import (
	"cmp"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// Defaults and bounds of the tainted authorities WatchBundles sends.
const (
	// DefaultReissueSpread is the window over which clients spread the
	// re-issuance a taint asks for: a minute turns 10,000 workloads into
	// under 200 signings a second, while a compromised authority's
	// credentials are all replaced within it.
	DefaultReissueSpread = time.Minute
	// MaxTaintedAuthorities bounds the tainted authorities a message
	// carries, the bound clients enforce too. A CA holds a handful of
	// authorities; more means a fault of the source, not of the CA, and
	// the excess is left out (and logged) rather than the stream broken.
	MaxTaintedAuthorities = 64
)

// Tainted is one tainted signing authority of the CA: an X.509 one (the
// CA certificate's SubjectKeyId and the hex SHA-256 of its DER, both
// set) or a JWT-SVID key (JWTKeyID), never both.
type Tainted struct {
	X509SubjectKeyID []byte
	X509SHA256       string
	JWTKeyID         string
	At               time.Time
}

// TaintSource reports the tainted authorities of the CA (those whose
// credentials clients must re-issue now) at one moment, and a channel
// closed when they may have changed (nil never fires).
type TaintSource interface {
	Tainted() ([]Tainted, <-chan struct{})
}

// taintCache keeps the wire form of the current taints, rendered once
// per change of the source rather than once per stream wake-up.
type taintCache struct {
	mu      sync.Mutex
	changed <-chan struct{}
	set     []*identityapi.TaintedAuthority
	valid   bool
}

// taints is the tainted authorities to send and the channel that fires
// when they change; none without a TaintSource.
func (s *Service) taints() ([]*identityapi.TaintedAuthority, <-chan struct{}) {
	if s.cfg.Taints == nil {
		return nil, nil
	}
	ts, changed := s.cfg.Taints.Tainted()
	c := &s.taintCache
	c.mu.Lock()
	defer c.mu.Unlock()
	// A nil channel never fires, so it cannot tell one set from the
	// next: render each time then.
	if c.valid && c.changed == changed && changed != nil {
		return c.set, changed
	}
	c.set, c.changed, c.valid = s.renderTaints(ts), changed, true
	return c.set, changed
}

// renderTaints is ts on the wire, sorted and each once so that equal
// sets make equal messages (sameMessage), at most MaxTaintedAuthorities;
// an entry the source got wrong is left out and logged.
func (s *Service) renderTaints(ts []Tainted) []*identityapi.TaintedAuthority {
	out := make([]*identityapi.TaintedAuthority, 0, min(len(ts), MaxTaintedAuthorities))
	for i, t := range ts {
		ta, err := taintedAuthority(t)
		if err != nil {
			s.cfg.Logger.Error("tainted authority left out of bundle streams", "index", i, "error", err)
			continue
		}
		out = append(out, ta)
	}
	slices.SortFunc(out, compareTainted)
	out = slices.CompactFunc(out, func(a, b *identityapi.TaintedAuthority) bool { return compareTainted(a, b) == 0 })
	if len(out) > MaxTaintedAuthorities {
		s.cfg.Logger.Error("tainted authorities over the bound left out of bundle streams", "tainted", len(out), "sent", MaxTaintedAuthorities)
		out = out[:MaxTaintedAuthorities]
	}
	return out
}

// taintedAuthority is t on the wire, or why it cannot be.
func taintedAuthority(t Tainted) (*identityapi.TaintedAuthority, error) {
	at := int64(0)
	if !t.At.IsZero() {
		at = t.At.Unix()
	}
	x509 := len(t.X509SubjectKeyID) > 0 || t.X509SHA256 != ""
	switch {
	case x509 && t.JWTKeyID != "":
		return nil, fmt.Errorf("authority %q names both an X.509 certificate and a JWT key; it must be one", t.JWTKeyID)
	case t.JWTKeyID != "":
		return &identityapi.TaintedAuthority{JwtKeyId: t.JWTKeyID, TaintedAtUnix: at}, nil
	case len(t.X509SubjectKeyID) == 0:
		return nil, errors.New("an X.509 authority without a SubjectKeyId (or an empty entry): clients match X509-SVIDs by it")
	}
	sum := strings.ToLower(t.X509SHA256)
	if b, err := hex.DecodeString(sum); err != nil || len(b) != 32 {
		return nil, fmt.Errorf("authority %x: SHA-256 %q is not 64 hex digits", t.X509SubjectKeyID, t.X509SHA256)
	}
	return &identityapi.TaintedAuthority{X509SubjectKeyId: hex.EncodeToString(t.X509SubjectKeyID), X509Sha256: sum, TaintedAtUnix: at}, nil
}

// compareTainted orders X.509 authorities by SHA-256 before JWT keys by
// kid, as the proto documents; the taint time breaks ties.
func compareTainted(a, b *identityapi.TaintedAuthority) int {
	return cmp.Or(
		cmp.Compare(a.GetJwtKeyId(), b.GetJwtKeyId()),
		cmp.Compare(a.GetX509Sha256(), b.GetX509Sha256()),
		cmp.Compare(a.GetX509SubjectKeyId(), b.GetX509SubjectKeyId()),
		cmp.Compare(a.GetTaintedAtUnix(), b.GetTaintedAtUnix()))
}

// withTaints sets msg's tainted authorities and spread when its subject
// id is of the CA's trust domain (any, when Config.TrustDomain is not
// set): the CA's authorities sign only those.
func (s *Service) withTaints(msg *identityapi.WatchBundlesResponse, id spiffeid.ID, taints []*identityapi.TaintedAuthority) {
	if len(taints) == 0 || (!s.cfg.TrustDomain.IsZero() && !id.MemberOf(s.cfg.TrustDomain)) {
		return
	}
	msg.TaintedAuthorities = taints
	msg.ReissueSpreadSeconds = int64((s.cfg.ReissueSpread + time.Second - 1) / time.Second)
}

// sameTaints tells whether two messages name the same taints.
func sameTaints(a, b *identityapi.WatchBundlesResponse) bool {
	return a.GetReissueSpreadSeconds() == b.GetReissueSpreadSeconds() &&
		slices.EqualFunc(a.GetTaintedAuthorities(), b.GetTaintedAuthorities(), func(x, y *identityapi.TaintedAuthority) bool {
			return compareTainted(x, y) == 0
		})
}
