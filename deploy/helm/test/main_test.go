package helmtest

import (
	"os"
	"testing"

	"github.com/trustbridge/trustbridge/internal/kubetest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }
