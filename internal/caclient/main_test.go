package caclient

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a client's connection, a
// test CA server or a reload loop running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
