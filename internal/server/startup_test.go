package server

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The start-up record says what the CA is and where its keys are: a
// self-signed root or an intermediate under which upstream, keys in the
// state's files, the state Secret or an HSM token (issue 36, item 5).
func TestCAMode(t *testing.T) {
	hsm := KeyManagerConfig{kind: "pkcs11", module: "/usr/lib/softhsm/libsofthsm2.so", tokenLabel: "tb", slot: -1}
	for _, tt := range []struct {
		name string
		o    Config
		want string
	}{
		{"self-signed", Config{DataDir: "/var/lib/tb"}, "self-signed, state in /var/lib/tb/ca, keys in files there (mode 0600)"},
		{"hsm token", Config{DataDir: "/var/lib/tb", Keys: hsm},
			`self-signed, state in /var/lib/tb/ca, keys in PKCS#11 token "tb" (module /usr/lib/softhsm/libsofthsm2.so)`},
		{"hsm slot", Config{DataDir: "/var/lib/tb", Keys: KeyManagerConfig{kind: "pkcs11", module: "/lib/p11.so", slot: 3}},
			"self-signed, state in /var/lib/tb/ca, keys in PKCS#11 slot 3 (module /lib/p11.so)"},
		{"upstream trustbridge", Config{DataDir: "/var/lib/tb", Upstream: UpstreamConfig{Kind: UpstreamTrustbridge, Trustbridge: TrustbridgeUpstreamConfig{Address: "up.example:15012"}}},
			"intermediate CA under the upstream trustbridge at up.example:15012, state in /var/lib/tb/ca, keys in files there (mode 0600)"},
		{"upstream kube-csr in an hsm", Config{DataDir: "/var/lib/tb", Keys: hsm, Upstream: UpstreamConfig{Kind: upstreamKubeCSR, kubeCSR: kubeCSROptions{signerName: "example.com/tb"}}},
			`intermediate CA under the Kubernetes CSR signer example.com/tb, state in /var/lib/tb/ca, keys in PKCS#11 token "tb" (module /usr/lib/softhsm/libsofthsm2.so)`},
		{"plug-in", Config{DataDir: "/var/lib/tb", CADir: "/etc/cacerts"}, "plug-in CA from /etc/cacerts (reloaded on change)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, caMode(tt.o, nil))
		})
	}
}
