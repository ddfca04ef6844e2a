package cli

import (
	"errors"
)

// ExitFindings is the exit status of `trustbridge audit` when it found
// problems at or above --fail-on; 1 means it could not audit at all.
const ExitFindings = 2

// ExitError ends the CLI with a status other than 1.
type ExitError struct {
	Code int
	Msg  string
}

func (e *ExitError) Error() string { return e.Msg }

// ExitTornTail is the exit status of `trustbridge audit log verify` when
// the chain verifies up to a torn final line.
const ExitTornTail = 3

// ExitPeersFailing is the exit status of `trustbridge federation status`
// when a federated trust domain is failing, stale or has never answered (unless
// --fail-on-error=false).
const ExitPeersFailing = 3

// ExitCode is the process status for err.
func ExitCode(err error) int {
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	return 1
}
