package attest

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(runChild(mode))
	}
	goleak.VerifyTestMain(kubetest.Tests(m))
}
