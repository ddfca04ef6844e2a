package server

import (
	"os"
	"testing"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

func TestMain(m *testing.M) {
	os.Exit(kubetest.Main(m))
}
