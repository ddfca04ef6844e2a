package caclient

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// TestWriteCredentialsFailureKeepsOldPair: renewing in place must not
// leave a new key.pem next to the old cert-chain.pem when a later file
// cannot be written: the pair would no longer match and the machine could
// not renew without a new bootstrap.
func TestWriteCredentialsFailureKeepsOldPair(t *testing.T) {
	issuer := testca.New(t, "example.org")
	leaf, _ := issuer.Issue(t, laptopID)
	key := testca.NewKey(t, testca.ECP256)
	peer := testca.New(t, "other.example")
	trust := Trust{TrustDomain: exampleTD, Local: []*x509.Certificate{issuer.Cert},
		Bundles: map[spiffeid.TrustDomain][]*x509.Certificate{otherTD: {peer.Cert}}}
	for _, blocked := range []string{KeyFile, ChainFile, RootsFile, BundleMapFile} {
		t.Run(blocked, func(t *testing.T) {
			dir := t.TempDir()
			old := map[string]string{KeyFile: "old key", ChainFile: "old chain", RootsFile: "old roots", BundleMapFile: "old map"}
			for name, data := range old {
				if name == blocked {
					// A directory in the way: its rename fails.
					require.NoError(t, os.MkdirAll(filepath.Join(dir, name, "x"), 0o700))
					continue
				}
				require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600))
			}
			err := WriteCredentials(dir, key, []*x509.Certificate{leaf}, trust)
			require.Error(t, err)
			assert.Contains(t, err.Error(), blocked)
			for name, data := range old {
				if name == blocked {
					continue
				}
				got, err := os.ReadFile(filepath.Join(dir, name))
				require.NoError(t, err)
				assert.Equal(t, data, string(got), "%s kept", name)
			}
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			assert.Len(t, entries, 4, "no temp files left behind")
		})
	}
}

// TestWriteCredentialsSymlink: a symlink planted as key.pem is replaced,
// not written through, and the key is 0600.
func TestWriteCredentialsSymlink(t *testing.T) {
	issuer := testca.New(t, "example.org")
	leaf, _ := issuer.Issue(t, laptopID)
	key := testca.NewKey(t, testca.ECP256)
	dir := t.TempDir()
	target := filepath.Join(t.TempDir(), "elsewhere")
	require.NoError(t, os.WriteFile(target, []byte("untouched"), 0o644))
	require.NoError(t, os.Symlink(target, filepath.Join(dir, KeyFile)))
	require.NoError(t, WriteCredentials(dir, key, []*x509.Certificate{leaf}, Trust{TrustDomain: exampleTD, Local: []*x509.Certificate{issuer.Cert}}))
	mark, err := os.Stat(filepath.Join(dir, OwnerFile))
	require.NoError(t, err, "the directory is marked trustbridge's")
	assert.Equal(t, os.FileMode(0o600), mark.Mode().Perm())
	foreign, err := ForeignCredentials(dir)
	require.NoError(t, err)
	assert.Empty(t, foreign)
	require.NoError(t, os.Remove(filepath.Join(dir, OwnerFile)))
	foreign, err = ForeignCredentials(dir)
	require.NoError(t, err)
	assert.Equal(t, []string{ChainFile, KeyFile}, foreign)
	got, err := os.ReadFile(target)
	require.NoError(t, err)
	assert.Equal(t, "untouched", string(got))
	info, err := os.Lstat(filepath.Join(dir, KeyFile))
	require.NoError(t, err)
	assert.True(t, info.Mode().IsRegular())
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
}

// What WriteCredentials writes, LoadCertDir, ReadPEMCerts and
// ParseBundleMap read back: root-cert.pem holds the local roots alone,
// federated ones are in the bundle map under their own trust domain.
func TestWriteThenLoadCertDir(t *testing.T) {
	issuer := testca.New(t, "example.org")
	peer := testca.New(t, "other.example", anonymous)
	key := testca.NewKey(t, testca.ECP256)
	leaf, _ := issuer.Issue(t, laptopID, testca.Options{Key: key})
	dir := filepath.Join(t.TempDir(), "new")
	trust := Trust{TrustDomain: exampleTD, Local: []*x509.Certificate{issuer.Cert},
		Bundles: map[spiffeid.TrustDomain][]*x509.Certificate{
			otherTD:   {peer.Cert},
			exampleTD: {peer.Cert}, // never written: Local is the local entry
		}}
	require.NoError(t, WriteCredentials(dir, key, []*x509.Certificate{leaf}, trust))
	for name, perm := range map[string]os.FileMode{KeyFile: 0o600, ChainFile: 0o644, RootsFile: 0o644, BundleMapFile: 0o644} {
		info, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		assert.Equal(t, perm, info.Mode().Perm(), name)
	}
	info, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), info.Mode().Perm())

	cert, id, err := LoadCertDir(dir, time.Now())
	require.NoError(t, err)
	assert.Equal(t, laptopID, id)
	assert.Equal(t, leaf.Raw, cert.Leaf.Raw)
	roots, err := ReadPEMCerts(filepath.Join(dir, RootsFile))
	require.NoError(t, err)
	assert.Equal(t, []*x509.Certificate{issuer.Cert}, roots)
	doc, err := os.ReadFile(filepath.Join(dir, BundleMapFile))
	require.NoError(t, err)
	byTD, err := ParseBundleMap(doc)
	require.NoError(t, err)
	assert.Equal(t, map[spiffeid.TrustDomain][]*x509.Certificate{exampleTD: {issuer.Cert}, otherTD: {peer.Cert}}, byTD)

	_, _, err = LoadCertDir(dir, leaf.NotAfter.Add(time.Second))
	assert.ErrorContains(t, err, "expired at")

	// Written again without a bundle map: the old one goes, so no stale
	// federated trust stays next to the new credentials.
	require.NoError(t, WriteCredentials(dir, key, []*x509.Certificate{leaf}, Trust{TrustDomain: exampleTD, Local: []*x509.Certificate{issuer.Cert}}))
	_, err = os.Stat(filepath.Join(dir, BundleMapFile))
	assert.ErrorIs(t, err, os.ErrNotExist)

	// No local roots: nothing is written.
	empty := filepath.Join(t.TempDir(), "empty")
	assert.ErrorContains(t, WriteCredentials(empty, key, []*x509.Certificate{leaf}, Trust{TrustDomain: exampleTD}), "no roots")
	_, err = os.Stat(empty)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestLoadCertDirRefusals(t *testing.T) {
	issuer := testca.New(t, "example.org")
	key := testca.NewKey(t, testca.ECP256)
	leaf, _ := issuer.Issue(t, laptopID, testca.Options{Key: key})
	noID, _ := issuer.Issue(t, laptopID, testca.Options{Key: key, Mutate: func(c *x509.Certificate) { c.URIs = nil }})
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	otherKey, err := x509.MarshalPKCS8PrivateKey(testca.NewKey(t, testca.ECP256))
	require.NoError(t, err)
	tests := []struct {
		name       string
		chain, key []byte
		err        string
	}{
		{"no chain", nil, keyPEM, "no such file"},
		{"no key", EncodeCerts([]*x509.Certificate{leaf}), nil, "no such file"},
		{"mismatched key", EncodeCerts([]*x509.Certificate{leaf}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: otherKey}), "private key does not match"},
		{"not an X509-SVID", EncodeCerts([]*x509.Certificate{noID}), keyPEM, "not an X509-SVID"},
		{"oversized chain", make([]byte, MaxPEMFileSize+1), keyPEM, "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.chain != nil {
				require.NoError(t, os.WriteFile(filepath.Join(dir, ChainFile), tt.chain, 0o644))
			}
			if tt.key != nil {
				require.NoError(t, os.WriteFile(filepath.Join(dir, KeyFile), tt.key, 0o600))
			}
			_, _, err := LoadCertDir(dir, time.Now())
			assert.ErrorContains(t, err, tt.err)
		})
	}
}

func TestReadToken(t *testing.T) {
	tests := []struct {
		name, data, token, err string
	}{
		{name: "trailing newline", data: "abc\n", token: "abc"},
		{name: "surrounding space", data: "  abc \r\n", token: "abc"},
		{name: "empty", data: "\n", err: "is empty"},
		{name: "two words", data: "a b", err: "more than one"},
		{name: "two lines", data: "a\nb\n", err: "more than one"},
		{name: "oversized", data: string(make([]byte, MaxTokenFileSize+1)), err: "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "token")
			require.NoError(t, os.WriteFile(p, []byte(tt.data), 0o600))
			token, err := ReadToken(p)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				assert.NotContains(t, err.Error(), "abc")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.token, token)
		})
	}
	_, err := ReadToken(filepath.Join(t.TempDir(), "none"))
	assert.Error(t, err)
	_, err = ReadToken(t.TempDir())
	assert.Error(t, err, "a directory is not a token file")
}

func TestParsePEMCerts(t *testing.T) {
	a := testca.New(t, "example.org").Cert
	b := testca.New(t, "other.example").Cert
	key := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("x")})
	tests := []struct {
		name string
		data []byte
		want []*x509.Certificate
		err  string
	}{
		{name: "two", data: EncodeCerts([]*x509.Certificate{a, b}), want: []*x509.Certificate{a, b}},
		{name: "other blocks skipped", data: append(append([]byte("junk\n"), key...), EncodeCerts([]*x509.Certificate{b})...), want: []*x509.Certificate{b}},
		{name: "none", data: key, err: "no PEM certificates"},
		{name: "empty", err: "no PEM certificates"},
		{name: "bad DER", data: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("nope")}), err: "certificate 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePEMCerts(tt.data)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func FuzzParsePEMCerts(f *testing.F) {
	a := testca.New(f, "example.org").Cert
	f.Add(EncodeCerts([]*x509.Certificate{a}))
	f.Add(EncodeCerts([]*x509.Certificate{a, a}))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		certs, err := ParsePEMCerts(data)
		if err != nil {
			assert.Nil(t, certs)
			return
		}
		require.NotEmpty(t, certs)
		for _, c := range certs {
			require.NotNil(t, c)
		}
		again, err := ParsePEMCerts(EncodeCerts(certs))
		require.NoError(t, err)
		assert.Equal(t, len(certs), len(again))
	})
}
