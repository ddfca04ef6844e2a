package server

import (
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func parseKeyManagerFlags(t *testing.T, args ...string) KeyManagerConfig {
	t.Helper()
	var o KeyManagerConfig
	f := pflag.NewFlagSet("t", pflag.ContinueOnError)
	addKeyManagerFlags(f, &o)
	require.NoError(t, f.Parse(args))
	return o
}

func TestKeyManagerFlags(t *testing.T) {
	noEnv := func(string) string { return "" }
	pinEnvSet := func(k string) string {
		if k == pinEnv {
			return "1234"
		}
		return ""
	}
	full := []string{"--key-manager", "pkcs11", "--pkcs11-module", "/lib/softhsm.so", "--pkcs11-token-label", "tb"}
	for _, tc := range []struct {
		name   string
		args   []string
		getenv func(string) string
		caDir  string
		want   string // "" = accepted
	}{
		{"none", nil, noEnv, "", ""},
		{"pkcs11 with pin file", append(full, "--pkcs11-pin-file", "/pin"), noEnv, "", ""},
		{"pkcs11 with pin env", full, pinEnvSet, "", ""},
		{"pkcs11 by slot", []string{"--key-manager", "pkcs11", "--pkcs11-module", "/m.so", "--pkcs11-slot", "0"}, pinEnvSet, "", ""},
		{"require-hsm with pkcs11", append(full, "--require-hsm"), pinEnvSet, "", ""},
		{"unknown kind", []string{"--key-manager", "kms"}, noEnv, "", `--key-manager "kms": unknown`},
		{"no module", []string{"--key-manager", "pkcs11", "--pkcs11-token-label", "tb"}, pinEnvSet, "", "needs --pkcs11-module"},
		{"no token", []string{"--key-manager", "pkcs11", "--pkcs11-module", "/m.so"}, pinEnvSet, "", "needs --pkcs11-token-label"},
		{"no pin", full, noEnv, "", "--pkcs11-pin-file FILE, or env " + pinEnv},
		{"bad slot", []string{"--key-manager", "pkcs11", "--pkcs11-module", "/m.so", "--pkcs11-slot", "-2"}, pinEnvSet, "", "--pkcs11-slot -2"},
		{"label and slot", append(full, "--pkcs11-slot", "0"), pinEnvSet, "", "give one of them"},
		{"with ca-dir", full, pinEnvSet, "/cacerts", "does not combine with --ca-dir"},
		{"require-hsm alone", []string{"--require-hsm"}, noEnv, "", "--require-hsm: keys must live in a key manager; add --key-manager pkcs11"},
		{"module without kind", []string{"--pkcs11-module", "/m.so"}, noEnv, "", "--pkcs11-module is set but --key-manager is not"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := parseKeyManagerFlags(t, tc.args...)
			err := o.check(tc.getenv, tc.caDir)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
			_, _, err = o.open(tc.getenv, tc.caDir, nil)
			require.ErrorContains(t, err, tc.want, "open refuses what check refuses")
		})
	}
}

func TestKeyManagerOpenNone(t *testing.T) {
	o := parseKeyManagerFlags(t)
	m, closeKeys, err := o.open(func(string) string { return "" }, "", nil)
	require.NoError(t, err)
	assert.Nil(t, m)
	closeKeys()
}
