package server

import (
	"fmt"
	"maps"
	"slices"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
)

// jwtKeySeen is one of the CA's JWT signing keys as last seen.
type jwtKeySeen struct {
	state   castate.RootState
	fp      string // as the audit log names authorities: jwt:<kid>:<sha256>
	tainted bool
}

// jwtKeyEntriesLocked are the entries for how the CA's JWT signing keys
// changed since last seen, as observeCA makes them for its roots: the
// same events with a jwt_key_ prefix, fingerprints in the form
// bundle_accepted entries use for a peer's JWT authorities. t.mu is held.
func (t *auditTrail) jwtKeyEntriesLocked(keys []ca.JWTKeyInfo, td string, seq uint64, baseline bool) []audit.Entry {
	now := make(map[string]jwtKeySeen, len(keys))
	var entries []audit.Entry
	for _, k := range keys {
		seen := jwtKeySeen{state: k.State, fp: "jwt:" + k.KID + ":" + api.SPKISHA256(k.Public), tainted: !k.TaintedAt.IsZero()}
		now[k.KID] = seen
		old, ok := t.jwtKeys[k.KID]
		if !baseline && ok && old == seen {
			continue
		}
		entries = append(entries, jwtKeyEntries(k, seen, td, seq, old, ok, baseline)...)
	}
	if !baseline {
		for _, kid := range slices.Sorted(maps.Keys(t.jwtKeys)) {
			if _, ok := now[kid]; !ok {
				entries = append(entries, audit.Entry{Event: "jwt_key_removed", TrustDomain: td,
					NewSequence: &seq, Removed: []string{t.jwtKeys[kid].fp}, Reason: "jwt key " + kid})
			}
		}
	}
	t.jwtKeys = now
	return entries
}

// jwtKeyEntries are the entries for key k, seen now as seen and last as
// old (when known), as rootEntries makes them for a root.
func jwtKeyEntries(k ca.JWTKeyInfo, seen jwtKeySeen, td string, seq uint64, old jwtKeySeen, known, baseline bool) []audit.Entry {
	e := audit.Entry{TrustDomain: td, NewSequence: &seq, Event: jwtKeyEvent(k.State), Reason: "jwt key " + k.KID}
	switch {
	case baseline:
		e.Event, e.Reason = "baseline", fmt.Sprintf("jwt key %s %s%s at start", k.KID, k.State, taintNote(k.TaintedAt))
		e.Added = []string{seen.fp}
	case k.State == castate.StateRevoked && (!known || old.state != k.State):
		// It left the bundle.
		e.Removed = []string{seen.fp}
	case !known:
		e.Added = []string{seen.fp}
	case old.fp != seen.fp:
		// A kid reused for another key: never by our CA, but the log
		// must show it if it happens.
		e.Added, e.Removed = []string{seen.fp}, []string{old.fp}
	case old.state != k.State:
		e.Reason = fmt.Sprintf("jwt key %s %s -> %s", k.KID, old.state, k.State)
	default:
		e.Event = "" // only tainted
	}
	var out []audit.Entry
	if !baseline && seen.tainted && (!known || !old.tainted) {
		out = append(out, audit.Entry{Event: "jwt_key_tainted", TrustDomain: td, NewSequence: &seq,
			Reason: "jwt key " + k.KID + taintNote(k.TaintedAt) + ": clients re-issue the JWT-SVIDs it signed"})
	}
	if e.Event != "" {
		// After the taint, which came first when both are seen at once.
		out = append(out, e)
	}
	return out
}

// jwtKeyEvent names the audit event of a JWT key entering state.
func jwtKeyEvent(s castate.RootState) string {
	switch s {
	case castate.StatePrepared:
		return "jwt_key_prepared"
	case castate.StateActive:
		return "jwt_key_activated"
	case castate.StateRetired:
		return "jwt_key_retired"
	case castate.StateRevoked:
		return "jwt_key_revoked"
	}
	return "jwt_key_loaded"
}
