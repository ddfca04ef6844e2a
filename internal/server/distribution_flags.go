package server

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/trustbridge/trustbridge/federation/distribution"
)

// DistributionConfig is what the per-namespace distribution writes
// besides --root-configmap: a Secret target, the PKCS#12 truststore, and
// the labels and annotations of what it writes.
type DistributionConfig struct {
	RootSecret          string
	Truststore          bool
	TruststorePassword  string // a file, normally a mounted Secret
	TruststoreProfile   string
	Labels, Annotations []string
}

func addDistributionFlags(f *pflag.FlagSet, o *DistributionConfig) {
	f.StringVar(&o.RootSecret, "root-secret", "", "with --storage kube, also keep an Opaque Secret of this name, with the same keys as --root-configmap, in every namespace matching --namespace-selector (for consumers that read only Secrets); needs deploy/rbac/distribution-secret. Off by default")
	f.BoolVar(&o.Truststore, "root-truststore", false, "add "+distribution.KeyTruststore+", a PKCS#12 truststore of the local trust domain's roots only, for Java, to --root-configmap (binaryData) and --root-secret; federated roots are never merged into it (docs/trust-distribution.md)")
	f.StringVar(&o.TruststorePassword, "root-truststore-password-file", "", "file holding the password of --root-truststore (normally a mounted Secret; read at start, a trailing newline dropped); without it the truststore is passwordless (no encryption, no MAC), as trust-manager writes it: leave the JVM's trustStorePassword unset")
	f.StringVar(&o.TruststoreProfile, "root-truststore-profile", distribution.ProfileLegacyRC2, "PKCS#12 algorithms of a --root-truststore with a password, as trust-manager names them: "+distribution.ProfileLegacyRC2+" (every Java), "+distribution.ProfileLegacyDES+" or "+distribution.ProfileModern2023+" (Java 8u301, 11.0.12 and later)")
	f.StringArrayVar(&o.Labels, "distribution-label", nil, "KEY=VALUE label set on every --root-configmap and --root-secret written (repeatable; never "+distribution.ManagedByLabel+", which marks what trustbridge owns)")
	f.StringArrayVar(&o.Annotations, "distribution-annotation", nil, "KEY=VALUE annotation set on every --root-configmap and --root-secret written (repeatable)")
}

// parseKeyValues turns repeated KEY=VALUE flag values into a map. The
// value may be empty and may hold "="; the key may not be empty, and may
// not repeat.
func parseKeyValues(flag string, vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(vals))
	for _, kv := range vals {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q: want KEY=VALUE", flag, kv)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("--%s %q: key %q given twice", flag, kv, k)
		}
		out[k] = v
	}
	return out, nil
}

// distributionConfig turns the flags into the parts of
// distribution.Config they set, reading the truststore password file.
func (o DistributionConfig) distributionConfig() (distribution.Config, error) {
	var cfg distribution.Config
	var err error
	if cfg.Labels, err = parseKeyValues("distribution-label", o.Labels); err != nil {
		return cfg, err
	}
	if cfg.Annotations, err = parseKeyValues("distribution-annotation", o.Annotations); err != nil {
		return cfg, err
	}
	cfg.Truststore = distribution.Truststore{Enabled: o.Truststore, Profile: o.TruststoreProfile}
	if o.TruststorePassword != "" {
		if !o.Truststore {
			return cfg, fmt.Errorf("--root-truststore-password-file %q needs --root-truststore", o.TruststorePassword)
		}
		b, err := os.ReadFile(o.TruststorePassword)
		if err != nil {
			return cfg, fmt.Errorf("--root-truststore-password-file: %w", err)
		}
		cfg.Truststore.Password = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if cfg.Truststore.Password == "" {
			return cfg, fmt.Errorf("--root-truststore-password-file %q is empty: leave the flag out for a passwordless truststore", o.TruststorePassword)
		}
	}
	return cfg, nil
}

// checkDistributionFlags refuses, before anything connects, distribution
// flags that cannot take effect or do not parse.
func checkDistributionFlags(o KubeConfig) error {
	d := o.Distribution
	if o.Storage != StorageKube && (d.RootSecret != "" || d.Truststore || len(d.Labels) > 0 || len(d.Annotations) > 0) {
		return fmt.Errorf("--root-secret, --root-truststore, --distribution-label and --distribution-annotation need --storage kube: the leader writes the namespaces' ConfigMaps and Secrets")
	}
	// Those Secrets carry the same managed-by label: the distribution
	// would take them for its own in --namespace.
	if d.RootSecret != "" && (d.RootSecret == o.CASecret || d.RootSecret == o.tokenSecret) {
		return fmt.Errorf("--root-secret %q is the name of --ca-secret or --bootstrap-token-secret, which trustbridge also labels as its own: pick another name", d.RootSecret)
	}
	_, err := d.distributionConfig()
	return err
}
