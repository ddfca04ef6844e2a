package pkcs11

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConfigValidate(t *testing.T) {
	module := filepath.Join(t.TempDir(), "libhsm.so")
	require.NoError(t, os.WriteFile(module, nil, 0o600))
	slot, neg := 3, -1
	ok := Config{Module: module, TokenLabel: "tb", PIN: "1234"}
	tests := []struct {
		name string
		edit func(*Config)
		want string // "" = valid
	}{
		{"by label", func(*Config) {}, ""},
		{"by slot", func(c *Config) { c.TokenLabel, c.Slot = "", &slot }, ""},
		{"no module", func(c *Config) { c.Module = "" }, "no module: set --pkcs11-module"},
		{"relative module", func(c *Config) { c.Module = "libhsm.so" }, "--pkcs11-module libhsm.so: not an absolute path"},
		{"missing module", func(c *Config) { c.Module = "/nonexistent/libhsm.so" }, "--pkcs11-module /nonexistent/libhsm.so: no such file"},
		{"no token", func(c *Config) { c.TokenLabel = "" }, "set one of --pkcs11-token-label and --pkcs11-slot"},
		{"both", func(c *Config) { c.Slot = &slot }, "both --pkcs11-token-label and --pkcs11-slot set"},
		{"negative slot", func(c *Config) { c.TokenLabel, c.Slot = "", &neg }, "--pkcs11-slot -1"},
		{"no PIN", func(c *Config) { c.PIN = "" }, "no PIN: set --pkcs11-pin-file or TRUSTBRIDGE_PKCS11_PIN"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			err := c.validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
			_, err = New(c)
			require.Error(t, err, "New validates too")
		})
	}
}

func TestReadPIN(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == PINEnv {
				return v
			}
			return ""
		}
	}
	tests := []struct {
		name, file, env, want, err string
	}{
		{"file", write("pin", "1234\n"), "env", "1234", ""},
		{"file CRLF", write("crlf", "1234\r\n"), "", "1234", ""},
		{"file without newline", write("nonl", "12 34"), "", "12 34", ""},
		{"env", "", "5678", "5678", ""},
		{"neither", "", "", "", "set --pkcs11-pin-file FILE or the environment variable TRUSTBRIDGE_PKCS11_PIN"},
		{"empty file", write("empty", "\n"), "5678", "", "empty; write the token's user PIN in it"},
		{"missing file", filepath.Join(dir, "nope"), "5678", "", "no such file"},
		{"large file", write("large", strings.Repeat("1", maxPINFile+1)), "", "", "larger than 1024 bytes"},
		{"1 KiB file", write("kib", strings.Repeat("1", maxPINFile)), "", strings.Repeat("1", maxPINFile), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pin, err := ReadPIN(tc.file, env(tc.env))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				assert.Empty(t, pin)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, pin)
		})
	}
}

func TestParseRef(t *testing.T) {
	id := []byte{0: 0xab, 15: 0x01}
	got, err := ParseRef(formatRef(id))
	require.NoError(t, err)
	assert.Equal(t, id, got)
	for _, bad := range []string{
		"", "pkcs11:", "pkcs11:id=", "pkcs11:id=ab", "PKCS11:id=ab000000000000000000000000000001",
		"pkcs11:id=AB000000000000000000000000000001", "pkcs11:id=zz000000000000000000000000000001",
		"pkcs11:id=ab0000000000000000000000000000010", "pkcs11:id=ab000000000000000000000000000001;label=x",
		"pkcs11:label=x", " pkcs11:id=ab000000000000000000000000000001",
	} {
		_, err := ParseRef(bad)
		assert.Error(t, err, bad)
	}
}

func FuzzParseRef(f *testing.F) {
	f.Add("pkcs11:id=ab000000000000000000000000000001")
	f.Add("pkcs11:id=AB000000000000000000000000000001")
	f.Add("pkcs11:id=ab")
	f.Add("pkcs11:object=root;id=%ab")
	f.Add("")
	f.Fuzz(func(t *testing.T, ref string) {
		id, err := ParseRef(ref)
		if err != nil {
			if id != nil {
				t.Fatalf("ParseRef(%q) returned an id with an error", ref)
			}
			return
		}
		if len(id) != idLen {
			t.Fatalf("ParseRef(%q) = %d bytes, want %d", ref, len(id), idLen)
		}
		if formatRef(id) != ref {
			t.Fatalf("ParseRef(%q) does not round-trip: %q", ref, formatRef(id))
		}
	})
}
