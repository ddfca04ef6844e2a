package ca

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca/castate"
)

// RequestRotation prepares a successor root in dataDir on behalf of the
// serving trustbridge, for `trustbridge ca rotate`. It only appends a
// prepared root, created with the settings the server recorded in the
// journal; it runs no rotation plan of its own. The root is not yet
// published: the server publishes it at its next check (within 30s) and
// counts the publication lead from then. If a prepared root is already
// waiting, nothing changes and created is false.
func RequestRotation(dataDir string, now time.Time) (rootID string, created bool, err error) {
	s := NewStore(dataDir)
	unlock, err := s.lockExisting()
	if err != nil {
		return "", false, err
	}
	defer unlock()
	j, roots, err := s.Load("")
	if err != nil {
		return "", false, err
	}
	if j.UsesKeyManager() {
		return "", false, errRequestInKeyManager
	}
	if j == nil {
		return "", false, fmt.Errorf("ca: no CA state in %s; start the server first", s.Dir())
	}
	if len(j.PluginRoots) > 0 {
		return "", false, errors.New("ca: this data directory serves a plug-in CA (--ca-dir); rotate its roots there")
	}
	for _, r := range roots {
		if r.State == castate.StatePrepared {
			return r.ID, false, nil
		}
	}
	st := castate.JournalSettings{KeyType: string(KeyECP256), RootTTLSeconds: int64(defaultRootTTL / time.Second), RefreshHintSeconds: int64(defaultRefreshHint / time.Second)}
	if j.Settings != nil {
		st = *j.Settings
	}
	td, err := spiffeid.TrustDomainFromString(j.TrustDomain)
	if err != nil {
		return "", false, fmt.Errorf("ca: journal trust domain: %w", err)
	}
	cert, key, err := newRootCert(td, KeyType(st.KeyType), now, time.Duration(st.RootTTLSeconds)*time.Second, st.SignsIntermediates)
	if err != nil {
		return "", false, fmt.Errorf("ca: create root: %w", err)
	}
	id, err := s.writeRoot(cert, key)
	if err != nil {
		return "", false, err
	}
	j.Roots = append(j.Roots, castate.RootRecord{
		ID: id, State: castate.StatePrepared, CertSHA256: fingerprint(cert), PreparedAt: now,
		MinActivateAt: now.Add(PublishLead * time.Duration(st.RefreshHintSeconds) * time.Second),
	})
	j.Sequence = nextSequence(j.Sequence, now)
	j.Events = append(j.Events, castate.JournalNote{At: now, Event: "prepared (requested)", RootID: id})
	j.Updated = now
	if err := s.saveJournal(j); err != nil {
		_ = s.removeRootFiles(id)
		return "", false, err
	}
	return id, true, nil
}

// lockExisting takes the exclusive lock for a change a tool makes to the
// state beside a server. The shared lock comes first: it refuses to
// create a state directory where there is none (a mistyped --data-dir),
// which the exclusive one would.
func (s *Store) lockExisting() (func(), error) {
	unlock, err := s.Lock(false)
	if err != nil {
		return nil, err
	}
	unlock()
	return s.Lock(true)
}

// RequestJWTRotation is RequestRotation for the JWT-SVID signing keys
// (`trustbridge ca rotate --jwt`): it prepares a successor JWT key in
// dataDir with the key type and lifetime the server recorded, unless one
// is already waiting (then it returns that one's kid). The server
// publishes it at its next check and activates it PublishLead refresh
// hints later. It also works on a plug-in CA's state: JWT keys are
// trustbridge's own there too.
func RequestJWTRotation(dataDir string, now time.Time) (kid string, created bool, err error) {
	s := NewStore(dataDir)
	unlock, err := s.lockExisting()
	if err != nil {
		return "", false, err
	}
	defer unlock()
	j, _, keys, _, err := s.load("")
	if err != nil {
		return "", false, err
	}
	if j.UsesKeyManager() {
		return "", false, errRequestInKeyManager
	}
	if j == nil {
		return "", false, fmt.Errorf("ca: no CA state in %s; start the server first", s.Dir())
	}
	for _, k := range keys {
		if k.State == castate.StatePrepared {
			return k.KID, false, nil
		}
	}
	kt, ttl, hint := defaultJWTKeyType, defaultJWTKeyTTL, defaultRefreshHint
	if st := j.Settings; st != nil && st.JWTKeyType != "" {
		kt, ttl, hint = JWTKeyType(st.JWTKeyType), time.Duration(st.JWTKeyTTLSeconds)*time.Second, time.Duration(st.RefreshHintSeconds)*time.Second
	}
	k, err := newJWTKey(kt, now, ttl)
	if err != nil {
		return "", false, err
	}
	// No PublishedAt: the lead counts from when a server publishes it.
	k.State, k.MinActivateAt = castate.StatePrepared, now.Add(PublishLead*hint)
	if err := s.writeJWTKeyOnce(k); err != nil {
		return "", false, err
	}
	j.JWTKeys = append(j.JWTKeys, k.JWTKeyRecord)
	j.Sequence = nextSequence(j.Sequence, now)
	j.Events = append(j.Events, castate.JournalNote{At: now, Event: "JWT key prepared (requested)", KID: k.KID})
	j.Updated = now
	if err := s.saveJournal(j); err != nil {
		_ = os.Remove(s.jwtKeyPath(k.KID))
		return "", false, err
	}
	return k.KID, true, nil
}
