package loop

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: Poll
// and RunAll start goroutines and must end every one.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
