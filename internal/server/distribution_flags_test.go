package server

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/trustbridge/trustbridge/federation/distribution"
	"github.com/trustbridge/trustbridge/federation/trust"
)

func TestParseKeyValues(t *testing.T) {
	tests := []struct {
		name    string
		in      []string
		want    map[string]string
		wantErr string
	}{
		{name: "none"},
		{name: "one", in: []string{"team.example/owner=platform"}, want: map[string]string{"team.example/owner": "platform"}},
		{name: "empty value", in: []string{"k="}, want: map[string]string{"k": ""}},
		{name: "value with =", in: []string{"k=a=b"}, want: map[string]string{"k": "a=b"}},
		{name: "several", in: []string{"a=1", "b=2"}, want: map[string]string{"a": "1", "b": "2"}},
		{name: "no =", in: []string{"k"}, wantErr: `--distribution-label "k": want KEY=VALUE`},
		{name: "empty key", in: []string{"=v"}, wantErr: `--distribution-label "=v": want KEY=VALUE`},
		{name: "repeated key", in: []string{"k=1", "k=2"}, wantErr: `key "k" given twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseKeyValues("distribution-label", tt.in)
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestDistributionFlags(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "password")
	require.NoError(t, os.WriteFile(pw, []byte("changeit\n"), 0o600))
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	kube := func(d DistributionConfig) KubeConfig {
		return KubeConfig{Storage: StorageKube, CASecret: "trustbridge-ca", tokenSecret: "trustbridge-bootstrap-tokens", Distribution: d}
	}

	cfg, err := DistributionConfig{Truststore: true, TruststorePassword: pw, Labels: []string{"a=1"}, Annotations: []string{"n=x y"}}.distributionConfig()
	require.NoError(t, err)
	assert.Equal(t, distribution.Truststore{Enabled: true, Password: "changeit"}, cfg.Truststore)
	assert.Equal(t, map[string]string{"a": "1"}, cfg.Labels)
	assert.Equal(t, map[string]string{"n": "x y"}, cfg.Annotations)

	for _, tt := range []struct {
		o       KubeConfig
		wantErr string
	}{
		{o: KubeConfig{Storage: StorageFile, Distribution: DistributionConfig{RootSecret: "s"}}, wantErr: "need --storage kube"},
		{o: kube(DistributionConfig{RootSecret: "trustbridge-ca"}), wantErr: `--root-secret "trustbridge-ca" is the name of --ca-secret`},
		{o: kube(DistributionConfig{RootSecret: "trustbridge-bootstrap-tokens"}), wantErr: "--bootstrap-token-secret"},
		{o: kube(DistributionConfig{TruststorePassword: pw}), wantErr: "needs --root-truststore"},
		{o: kube(DistributionConfig{Truststore: true, TruststorePassword: empty}), wantErr: "is empty"},
		{o: kube(DistributionConfig{Truststore: true, TruststorePassword: filepath.Join(dir, "missing")}), wantErr: "--root-truststore-password-file"},
		{o: kube(DistributionConfig{Annotations: []string{"x"}}), wantErr: `--distribution-annotation "x"`},
		{o: kube(DistributionConfig{RootSecret: "trustbridge-ca-root-cert", Truststore: true})},
	} {
		err := checkDistributionFlags(tt.o)
		if tt.wantErr == "" {
			assert.NoError(t, err)
			continue
		}
		assert.ErrorContains(t, err, tt.wantErr)
	}
}

// TestDistributionsShareRegistry: the ConfigMap and Secret controllers
// register on one registry (their metrics told apart by kind), and each
// is made only when its name is set.
func TestDistributionsShareRegistry(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	fed := &federationSetup{store: trust.NewStore()}
	for _, tt := range []struct {
		configMap, secret string
		want              int
	}{{"", "", 0}, {distribution.DefaultName, "", 1}, {"", "roots", 1}, {distribution.DefaultName, "roots", 2}} {
		k := &kubeSetup{client: fake.NewClientset(), selector: labels.Everything(),
			o: KubeConfig{RootConfigMap: tt.configMap, Distribution: DistributionConfig{RootSecret: tt.secret, Truststore: true, Labels: []string{"a=b"}}}}
		reg := prometheus.NewRegistry()
		dists, err := k.distributions(td, fed, reg, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		assert.Len(t, dists, tt.want)
		families, err := reg.Gather()
		require.NoError(t, err)
		kinds := map[string]bool{}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "kind" {
						kinds[l.GetValue()] = true
					}
				}
			}
		}
		assert.Len(t, kinds, tt.want, "kind labels %v", kinds)
	}
}
