package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A bad --federate tuple or federation file is refused before the data
// directory holds anything: a first start (--init) with one leaves no CA
// behind (issue 36, item 3).
func TestFederationInputsRefusedBeforeState(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte("{not a bundle"), 0o644))
	badFile := filepath.Join(t.TempDir(), "federation.yaml")
	require.NoError(t, os.WriteFile(badFile, []byte("federation: [{trustDomain: x, bundleEndpointURL: ftp://x}]\n"), 0o644))
	for _, tt := range []struct {
		name string
		fed  FederationConfig
		want string
	}{
		{"bad bundle file", FederationConfig{Federate: "north.example|https://127.0.0.1:1/|" + bad}, "--federate"},
		{"missing bundle file", FederationConfig{Federate: "north.example|https://127.0.0.1:1/|" + bad + ".gone"}, "--federate"},
		{"bad federation file", FederationConfig{ConfigFile: badFile}, badFile},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dataDir := filepath.Join(t.TempDir(), "data")
			o := firstStart(dataDir)
			o.Federation = tt.fed
			err := runFirstStart(o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			_, statErr := os.Stat(filepath.Join(dataDir, "ca"))
			assert.True(t, os.IsNotExist(statErr), "no CA state was created")
		})
	}
}

// firstStart is a first start (--init) of example.org on dataDir, with
// the flags' defaults and loopback listeners.
func firstStart(dataDir string) Config {
	return Config{
		TrustDomain: "example.org", DataDir: dataDir, Init: true, AdminListen: "127.0.0.1:0", KeyType: "ec-p256",
		CATTL: 8760 * time.Hour, MaxWorkloadTTL: 90 * 24 * time.Hour, RefreshHint: 5 * time.Minute,
		LogFormat: "json", LogLevel: "info",
	}
}

// runFirstStart runs o as the server would; a start refused before it
// serves returns at once.
func runFirstStart(o Config) error {
	var out, logs strings.Builder
	return runServer(context.Background(), env{in: strings.NewReader(""), out: &out, err: &logs, now: time.Now}, o, nil)
}

// A bad bootstrap bundle file in a --federate tuple is refused in the
// user's terms: the flag, the tuple, the file, and no package's name.
func TestFederateBadBundleFileMessage(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "north.json")
	require.NoError(t, os.WriteFile(bad, []byte("garbage\n"), 0o644))
	tuple := "north.example|https://127.0.0.1:1/|spiffe://north.example/x|" + bad
	o := firstStart(filepath.Join(t.TempDir(), "data"))
	o.Federation = FederationConfig{Federate: tuple}
	err := runFirstStart(o)
	require.Error(t, err)
	assert.Equal(t, `--federate: federation: endpoint 0 ("`+tuple+`"): bootstrap bundle file "`+bad+
		`": invalid JSON at offset 0: invalid character 'g' looking for beginning of value`, err.Error())
}
