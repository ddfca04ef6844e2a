package castate

import (
	"errors"
	"fmt"

	"github.com/trustbridge/trustbridge/internal/kube/leader/fence"
)

// Sentinel errors of shared CA state.
var (
	// ErrCorruptState marks state trustbridge refuses to use. It is never
	// overwritten: an operator must look at it.
	ErrCorruptState = errors.New("corrupt CA state")
	// ErrConflict: another writer changed the CA state since this one read
	// it. Nothing was written; the writer reloads and decides again.
	ErrConflict = errors.New("CA state changed by another writer")
	// ErrNotLeader: this replica does not hold leadership, so it does not
	// change the CA state.
	ErrNotLeader = fence.ErrNotLeader
	// ErrAuthorityNotFound: an operator's change names an authority the
	// state does not hold.
	ErrAuthorityNotFound = errors.New("no such authority")
	// ErrAuthorityState: the authority is not in a state the change may
	// start from (a taint of the active root, a revoke of one not
	// tainted): making it would break the trust domain. Nothing changed.
	ErrAuthorityState = errors.New("authority change refused")
)

// TrustDomainError: the state is the CA of another trust domain than the
// one it was loaded for. It is refused and left alone as corrupt state is
// (errors.Is ErrCorruptState), but its message does not call it corrupt:
// the state may be sound, and the trust domain asked for, or the place
// the state was looked for, wrong. The caller, which knows where each
// came from (flags, a Secret's name), says which to fix.
type TrustDomainError struct {
	Holds string // the trust domain the state belongs to
	Want  string // the trust domain it was loaded for
}

func (e *TrustDomainError) Error() string {
	return fmt.Sprintf("it holds the CA of trust domain %q, not %q", e.Holds, e.Want)
}

// Is makes a TrustDomainError an ErrCorruptState: refused, never
// overwritten.
func (e *TrustDomainError) Is(target error) bool { return target == ErrCorruptState }

// Backend keeps the CA state: the journal and the material of every root
// and JWT key it names. The file store in --data-dir is the default;
// ca/kubestore keeps it in a Kubernetes Secret.
type Backend interface {
	// Load reads the journal and every root and JWT key it names, refusing
	// a journal of another trust domain than td (any, when td is empty),
	// and returns the version they were read at. No state yet is (nil,
	// nil, nil, "", nil). State that does not parse or check out is
	// ErrCorruptState; state of another trust domain is a
	// *TrustDomainError, which is ErrCorruptState too.
	Load(td string) (j *Journal, roots []*Root, jwtKeys []*JWTKey, version string, err error)
	// Commit persists j together with the material of exactly roots and
	// jwtKeys (those j names), all or nothing, if the state is still at
	// version base ("" for none); otherwise it writes nothing and returns
	// an error wrapping ErrConflict. It returns the new version.
	Commit(base string, j *Journal, roots []*Root, jwtKeys []*JWTKey) (version string, err error)
	// Version is the state's current version, "" when there is none; a
	// change means another writer committed.
	Version() (string, error)
	// Lock serializes readers and writers sharing the state where the
	// backend can (the file store's flock); the func releases it.
	Lock(exclusive bool) (unlock func(), err error)
	// Describe names where the state lives, for messages.
	Describe() string
}

// Leader says whether this replica leads. Only the leader changes the CA
// state; see Config.Leader.
type Leader interface {
	IsLeader() bool
}

// LeaderFunc adapts a function to Leader.
type LeaderFunc func() bool

// IsLeader calls f.
func (f LeaderFunc) IsLeader() bool { return f() }
