package server

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
)

func TestUpstreamOptions(t *testing.T) {
	for name, tc := range map[string]struct {
		o     UpstreamConfig
		caDir string
		want  string
	}{
		"none":                           {o: UpstreamConfig{TTL: time.Hour}},
		"unknown kind":                   {o: UpstreamConfig{Kind: "vault", TTL: time.Hour}, want: `--upstream "vault"`},
		"with ca-dir":                    {o: UpstreamConfig{Kind: UpstreamTrustbridge, TTL: time.Hour}, caDir: "/x", want: "cannot be combined"},
		"negative ttl":                   {o: UpstreamConfig{Kind: upstreamKubeCSR, TTL: -time.Hour}, want: "--upstream-ttl"},
		"trustbridge":                    {o: UpstreamConfig{Kind: UpstreamTrustbridge, TTL: time.Hour}, want: "--upstream-root-cert"},
		"kube-csr without an API server": {o: UpstreamConfig{Kind: upstreamKubeCSR, TTL: time.Hour}, want: "needs a Kubernetes API"},
		"kube-csr without roots": {o: UpstreamConfig{Kind: upstreamKubeCSR, TTL: time.Hour, kubeconfig: writeUnusedKubeconfig(t)},
			want: "--upstream-kube-roots FILE"},
	} {
		t.Run(name, func(t *testing.T) {
			var cfg ca.Config
			err := applyUpstream(tc.o, tc.caDir, &cfg, slog.New(slog.DiscardHandler))
			if tc.want == "" {
				require.NoError(t, err)
				assert.Nil(t, cfg.Upstream)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// writeUnusedKubeconfig writes a kubeconfig naming a loopback server nobody
// answers on: enough to build a client, which these checks never use.
func writeUnusedKubeconfig(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
	return path
}
