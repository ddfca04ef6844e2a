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
	state castate.RootState
	fp    string // as the audit log names authorities: jwt:<kid>:<sha256>
}

// jwtKeyEntriesLocked are the entries for how the CA's JWT signing keys
// changed since last seen, as observeCA makes them for its roots: the
// same events with a jwt_key_ prefix, fingerprints in the form
// bundle_accepted entries use for a peer's JWT authorities. t.mu is held.
func (t *auditTrail) jwtKeyEntriesLocked(keys []ca.JWTKeyInfo, td string, seq uint64, baseline bool) []audit.Entry {
	now := make(map[string]jwtKeySeen, len(keys))
	var entries []audit.Entry
	for _, k := range keys {
		seen := jwtKeySeen{state: k.State, fp: "jwt:" + k.KID + ":" + api.SPKISHA256(k.Public)}
		now[k.KID] = seen
		old, ok := t.jwtKeys[k.KID]
		if !baseline && ok && old == seen {
			continue
		}
		e := audit.Entry{TrustDomain: td, NewSequence: &seq, Event: jwtKeyEvent(k.State), Reason: "jwt key " + k.KID}
		switch {
		case baseline:
			e.Event, e.Reason = "baseline", fmt.Sprintf("jwt key %s %s at start", k.KID, k.State)
			e.Added = []string{seen.fp}
		case !ok:
			e.Added = []string{seen.fp}
		case old.fp != seen.fp:
			// A kid reused for another key: never by our CA, but the log
			// must show it if it happens.
			e.Added, e.Removed = []string{seen.fp}, []string{old.fp}
		default:
			e.Reason = fmt.Sprintf("jwt key %s %s -> %s", k.KID, old.state, k.State)
		}
		entries = append(entries, e)
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

// jwtKeyEvent names the audit event of a JWT key entering state.
func jwtKeyEvent(s castate.RootState) string {
	switch s {
	case castate.StatePrepared:
		return "jwt_key_prepared"
	case castate.StateActive:
		return "jwt_key_activated"
	case castate.StateRetired:
		return "jwt_key_retired"
	}
	return "jwt_key_loaded"
}
