package spiretest

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestSPIREServerConfig: the signing rate limit is on unless turned off, as
// SPIRE ships, and the log level is DEBUG unless set.
func TestSPIREServerConfig(t *testing.T) {
	s := &Server{socket: "/tmp/s/api.sock"}
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"defaults", Config{TrustDomain: "spire.example"}, []string{"signing = true", `log_level = "DEBUG"`}},
		{"unlimited", Config{TrustDomain: "spire.example", NoSigningRateLimit: true}, []string{"signing = false"}},
		{"info", Config{TrustDomain: "spire.example", LogLevel: "INFO"}, []string{`log_level = "INFO"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conf := s.config("/tmp/s", 8081, tc.cfg)
			for _, w := range tc.want {
				assert.Contains(t, conf, w)
			}
		})
	}
}
