package ca

import (
	"fmt"
	"io/fs"
	"path"

	"github.com/trustbridge/trustbridge/ca/castate"
)

// StateFile is one file of the CA state as a store in a data directory
// writes it, named relative to that directory with forward slashes.
type StateFile struct {
	Name string
	Data []byte
	Mode fs.FileMode
}

// Snapshot reads the CA state in dataDir under the state's shared lock,
// so no writer is half way through a change, checks it as a start would,
// and returns its journal and the files a store would write for it
// (journal, then each root's certificate and key, then each JWT key;
// keys mode 0600). Files the journal does not name, such as leftovers of
// an interrupted write, are not part of the state and are left out.
func Snapshot(dataDir string) (*castate.Journal, []StateFile, error) {
	s := NewStore(dataDir)
	unlock, err := s.Lock(false)
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	j, roots, jwtKeys, _, err := s.load("")
	if err != nil {
		return nil, nil, err
	}
	if j == nil {
		return nil, nil, fmt.Errorf("ca: no CA state in %s", s.Dir())
	}
	journal, err := castate.EncodeJournal(j.Clone())
	if err != nil {
		return nil, nil, s.wrap(err)
	}
	files := []StateFile{{Name: path.Join(stateDirName, journalName), Data: journal, Mode: 0o600}}
	for _, r := range roots {
		certPEM, keyPEM, err := castate.EncodeRoot(r)
		if err != nil {
			return nil, nil, s.wrap(err)
		}
		files = append(files, StateFile{Name: path.Join(stateDirName, rootsDirName, castate.RootCertKey(r.ID)), Data: certPEM, Mode: 0o644})
		if keyPEM != nil {
			files = append(files, StateFile{Name: path.Join(stateDirName, rootsDirName, castate.RootKeyKey(r.ID)), Data: keyPEM, Mode: 0o600})
		}
	}
	for _, k := range jwtKeys {
		keyPEM, err := castate.EncodeJWTKey(k)
		if err != nil {
			return nil, nil, s.wrap(err)
		}
		if keyPEM != nil {
			files = append(files, StateFile{Name: path.Join(stateDirName, rootsDirName, castate.JWTKeyKey(k.KID)), Data: keyPEM, Mode: 0o600})
		}
	}
	return j, files, nil
}

// StateDir is the directory of the CA state inside a data directory,
// which Snapshot covers.
const StateDir = stateDirName
