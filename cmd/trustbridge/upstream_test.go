package main

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
)

func TestUpstreamOptions(t *testing.T) {
	for name, tc := range map[string]struct {
		o     upstreamOptions
		caDir string
		want  string
	}{
		"none":         {o: upstreamOptions{ttl: time.Hour}},
		"unknown kind": {o: upstreamOptions{kind: "vault", ttl: time.Hour}, want: `--upstream "vault"`},
		"with ca-dir":  {o: upstreamOptions{kind: upstreamTrustbridge, ttl: time.Hour}, caDir: "/x", want: "cannot be combined"},
		"negative ttl": {o: upstreamOptions{kind: upstreamKubeCSR, ttl: -time.Hour}, want: "--upstream-ttl"},
		"trustbridge":  {o: upstreamOptions{kind: upstreamTrustbridge, ttl: time.Hour}, want: "--upstream-root-cert"},
		"kube-csr":     {o: upstreamOptions{kind: upstreamKubeCSR, ttl: time.Hour}, want: "not available"},
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
