package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
)

// --ca-dir with --storage kube is refused before anything connects, with
// a message naming both flags.
func TestKubeStorageRefusesCADir(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	_, errs, code := runCLI(t, "", "server", "--trust-domain", "example.org", "--data-dir", t.TempDir(),
		"--grpc-listen", "", "--admin-listen", "127.0.0.1:0", "--bundle-listen", "",
		"--storage", "kube", "--ca-dir", filepath.Join(t.TempDir(), "cacerts"))
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errs, "--ca-dir and --storage kube do not combine")
	assert.NotContains(t, errs, "--kubeconfig", "refused at the flags, before looking for a cluster")
}
