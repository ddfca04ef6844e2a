package attest

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

func TestMain(m *testing.M) {
	if code, ok := childMain(); ok {
		os.Exit(code)
	}
	goleak.VerifyTestMain(kubetest.Tests(m))
}

// callTimeout bounds every test RPC and wait, so a broken test fails
// instead of hanging; no test's outcome depends on it.
const callTimeout = 30 * time.Second

func newAttestor(t *testing.T, cfg Config) *Attestor {
	t.Helper()
	a, err := New(cfg)
	require.NoError(t, err)
	return a
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

func randomUID(t *testing.T) string {
	h := randomHex(t, 16)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
