package server

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// TestMain fails the package's tests if any goroutine outlives them, once
// the shared real API server (internal/testkit/kubetest) has stopped.
func TestMain(m *testing.M) { goleak.VerifyTestMain(kubetest.Tests(m)) }
