package rulesource

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them:
// FileSource.Run polls and must end with its context.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
