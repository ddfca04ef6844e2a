package main

import (
	"crypto/x509"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

// Without system roots (the image's empty base) the binary still has web
// roots to verify https_web peers and ACME with: the fallback bundle it
// links. Checked in a child process, since the system pool loads once.
func TestFallbackRootsWithoutSystemRoots(t *testing.T) {
	if os.Getenv("TRUSTBRIDGE_ROOTS_CHILD") == "1" {
		pool, err := x509.SystemCertPool()
		require.NoError(t, err)
		require.False(t, pool.Equal(x509.NewCertPool()), "no web roots at all")
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFallbackRootsWithoutSystemRoots$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TRUSTBRIDGE_ROOTS_CHILD=1", "SSL_CERT_FILE=/nonexistent/ca.crt", "SSL_CERT_DIR=/nonexistent")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
}
