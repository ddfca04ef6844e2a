package servertest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/audit"
)

// AuditEntries reads the chain at path after checking it verifies.
func AuditEntries(t testing.TB, path string) []audit.Entry {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	_, err = audit.Verify(bytes.NewReader(data))
	require.NoError(t, err, "the chain verifies")
	return ReadAuditLog(t, filepath.Dir(path))
}

// PolicyEvents are the trust_policy_* entries of the audit chain at path.
func PolicyEvents(t testing.TB, path string) []audit.Entry {
	var out []audit.Entry
	for _, e := range AuditEntries(t, path) {
		if strings.HasPrefix(e.Event, "trust_policy_") {
			out = append(out, e)
		}
	}
	return out
}

// ReadAuditLog is every entry of dataDir's audit.jsonl.
func ReadAuditLog(t testing.TB, dataDir string) []audit.Entry {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dataDir, "audit.jsonl"))
	require.NoError(t, err)
	var out []audit.Entry
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var e audit.Entry
		require.NoError(t, json.Unmarshal([]byte(line), &e))
		out = append(out, e)
	}
	return out
}

// SHA256Hex is the hex SHA-256 of b.
func SHA256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
