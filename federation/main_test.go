package federation

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: the
// Poller's Run loop and cron, and every fetch's connections, must end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
