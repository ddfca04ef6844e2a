package main

import (
	"archive/tar"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readLayout reads an archive WriteLayout wrote back with
// go-containerregistry's own OCI layout reader.
func readLayout(t *testing.T, archive string) v1.Image {
	t.Helper()
	f, err := os.Open(archive)
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	dir := t.TempDir()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		require.True(t, filepath.IsLocal(h.Name), "archive entry %q stays inside the layout", h.Name)
		require.NoError(t, os.MkdirAll(filepath.Join(dir, filepath.Dir(h.Name)), 0o755))
		data, err := io.ReadAll(tr)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, h.Name), data, 0o644))
	}
	idx, err := layout.ImageIndexFromPath(dir)
	require.NoError(t, err)
	m, err := idx.IndexManifest()
	require.NoError(t, err)
	require.Len(t, m.Manifests, 1)
	img, err := idx.Image(m.Manifests[0].Digest)
	require.NoError(t, err)
	return img
}

// forbidden are files that must never be in the image: the data
// directory `make run` fills (CA keys included), keys and PEM files.
var forbidden = regexp.MustCompile(`(^|/)data(/|$)|\.pem$|\.key$|(^|/)[^/]*key[^/]*$`)

// checkImage checks what a cluster relies on and returns the entrypoint's
// content: a numeric non-root user, an executable entrypoint, no secrets.
func checkImage(t *testing.T, img v1.Image) []byte {
	t.Helper()
	cfg, err := img.ConfigFile()
	require.NoError(t, err)
	user, group, ok := strings.Cut(cfg.Config.User, ":")
	require.True(t, ok, "user %q names a group", cfg.Config.User)
	for _, id := range []string{user, group} {
		n, err := strconv.Atoi(id)
		require.NoError(t, err, "numeric ids (runAsNonRoot can only check those): %q", cfg.Config.User)
		assert.NotZero(t, n, "not root")
	}
	assert.Equal(t, []string{Entrypoint}, cfg.Config.Entrypoint)
	assert.Equal(t, "linux", cfg.OS)
	for _, l := range []string{"version", "revision", "source"} {
		assert.Contains(t, cfg.Config.Labels, "org.opencontainers.image."+l)
	}

	files := map[string]*tar.Header{}
	var binary, passwd []byte
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		name := strings.TrimPrefix(strings.TrimSuffix(h.Name, "/"), "./")
		files[name] = h
		assert.NotRegexp(t, forbidden, name, "no data directory, key or PEM file in the image")
		switch name {
		case Entrypoint[1:]:
			binary, err = io.ReadAll(tr)
		case "etc/passwd":
			passwd, err = io.ReadAll(tr)
		}
		require.NoError(t, err)
	}
	h := files[Entrypoint[1:]]
	require.NotNil(t, h, "the entrypoint is in the layers")
	assert.EqualValues(t, tar.TypeReg, h.Typeflag)
	assert.NotZero(t, h.Mode&0o111, "the entrypoint is executable")
	assert.Contains(t, string(passwd), "nonroot:x:"+user+":"+group+":", "the user has a passwd entry")
	return binary
}

func testCACerts(t testing.TB) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test root"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func testSpec(t *testing.T) Spec {
	return Spec{Binary: []byte("#!not really a binary\n"), CACerts: testCACerts(t), Arch: "amd64",
		Created: time.Unix(1700000000, 0).UTC(), Labels: map[string]string{
			"org.opencontainers.image.version": "v1", "org.opencontainers.image.revision": "abc", "org.opencontainers.image.source": "https://example.org/x",
		}}
}

// An image built and written as a layout archive reads back with
// go-containerregistry as the image a cluster needs, byte for byte the same
// from the same inputs.
func TestBuildAndWriteLayout(t *testing.T) {
	spec := testSpec(t)
	archive := filepath.Join(t.TempDir(), "image.tar")
	var digests []v1.Hash
	for range 2 {
		img, err := Build(spec)
		require.NoError(t, err)
		require.NoError(t, writeFileAtomic(archive, func(w io.Writer) error { return WriteLayout(w, img, "example.org/tb:v1", "v1") }))
		back := readLayout(t, archive)
		assert.Equal(t, spec.Binary, checkImage(t, back))
		d, err := back.Digest()
		require.NoError(t, err)
		digests = append(digests, d)
		mt, err := back.MediaType()
		require.NoError(t, err)
		assert.Equal(t, "application/vnd.oci.image.manifest.v1+json", string(mt))
	}
	assert.Equal(t, digests[0], digests[1], "reproducible")
}

// A private key in the CA certificates file stops the build, whole or
// truncated, and so does anything else between the certificates.
func TestBuildRefusesKeysInCACerts(t *testing.T) {
	cert := testCACerts(t)
	two := append(append([]byte{}, cert...), cert...)
	cat := func(parts ...string) []byte { return []byte(strings.Join(parts, "")) }
	tests := []struct {
		name  string
		certs []byte
		want  string // "" means accepted
	}{
		{"one", cert, ""},
		{"two, whitespace around", cat("\n  ", string(cert), "\r\n\t\n", string(cert), "\n\n"), ""},
		{"CRLF", bytes.ReplaceAll(two, []byte("\n"), []byte("\r\n")), ""},
		{"key", cat(string(cert), "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n"), "not a -----BEGIN CERTIFICATE----- line"},
		{"truncated key between certificates", cat(string(cert), "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49\n", string(cert)), "not a -----BEGIN CERTIFICATE----- line"},
		{"raw base64 after", cat(string(two), "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n"), "not a -----BEGIN CERTIFICATE----- line"},
		{"comment line", cat("# a root\n", string(cert)), "line 1: not a"},
		{"truncated certificate", cert[:len(cert)/2], "has no -----END CERTIFICATE----- line"},
		{"not DER", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2, 3}}), "certificate 1"},
		{"broken first block hiding a second", cat("-----BEGIN CERTIFICATE-----\n!!\n", string(cert)), "not a well-formed PEM block"},
		{"empty", []byte("\n"), "no PEM certificate"},
		{"not pem", []byte("not pem\n"), "line 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := testSpec(t)
			spec.CACerts = tt.certs
			_, err := Build(spec)
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), "CA certificates")
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), "MIGH", "never quotes the file")
		})
	}
}

// The image `make image` wrote: its binary runs (it is this machine's
// architecture) and reports the version the image's label says.
func TestBuiltImage(t *testing.T) {
	archive := os.Getenv("TRUSTBRIDGE_IMAGE")
	if archive == "" {
		if os.Getenv("TRUSTBRIDGE_IMAGE_TESTS") == "require" {
			t.Fatal("TRUSTBRIDGE_IMAGE required (TRUSTBRIDGE_IMAGE_TESTS=require): run make image-tests")
		}
		t.Skip("TRUSTBRIDGE_IMAGE not set (make image-tests sets it to bin/trustbridge-image.tar)")
	}
	img := readLayout(t, archive)
	binary := checkImage(t, img)
	path := filepath.Join(t.TempDir(), "trustbridge")
	require.NoError(t, os.WriteFile(path, binary, 0o755))
	out, err := exec.Command(path, "version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	cfg, err := img.ConfigFile()
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(out), "trustbridge "+cfg.Config.Labels["org.opencontainers.image.version"]+" "), "version output %q", out)
	assert.Contains(t, cfg.Config.Labels, "org.opencontainers.image.revision")
}

// deploy/Dockerfile, for builds with a container engine, makes the same
// image as far as a cluster can tell: same user, same entrypoint.
func TestDockerfileAgrees(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	require.NoError(t, err)
	var user, entrypoint string
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "USER "); ok {
			user = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "ENTRYPOINT "); ok {
			entrypoint = strings.TrimSpace(v)
		}
	}
	assert.Equal(t, User, user)
	assert.Equal(t, `["`+Entrypoint+`"]`, entrypoint)
	assert.True(t, bytes.Contains(data, []byte("CGO_ENABLED=0")), "a static binary, as make image builds")
}

// A build that fails half way leaves the previous archive as it was and
// no temporary file behind.
func TestWriteFileAtomicKeepsLastGood(t *testing.T) {
	dir := t.TempDir()
	archive := filepath.Join(dir, "image.tar")
	require.NoError(t, os.WriteFile(archive, []byte("last good"), 0o644))
	err := writeFileAtomic(archive, func(w io.Writer) error {
		_, _ = w.Write([]byte("half"))
		return errors.New("layer: disk full")
	})
	require.ErrorContains(t, err, "disk full")
	data, err := os.ReadFile(archive)
	require.NoError(t, err)
	assert.Equal(t, "last good", string(data))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file left")
}

// checkCACerts lets nothing but certificates through, whatever the input:
// what it accepts holds no private key, and every PEM block in it (as many
// as there are BEGIN lines) is a certificate x509 parses.
func FuzzCheckCACerts(f *testing.F) {
	cert := testCACerts(f)
	f.Add(cert)
	f.Add(append(append([]byte{}, cert...), cert...))
	f.Add(append(append([]byte{}, cert...), "-----BEGIN PRIVATE KEY-----\nAQID\n-----END PRIVATE KEY-----\n"...))
	f.Add(append(append([]byte{}, cert...), "-----BEGIN PRIVATE KEY-----\nAQID\n"...))
	f.Add([]byte("junk\n" + string(cert) + "trailing"))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n!!\n" + string(cert)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		if checkCACerts(data) != nil {
			return
		}
		if bytes.Contains(data, []byte("PRIVATE KEY")) {
			t.Fatal("accepted a file naming a private key")
		}
		n := 0
		for rest := data; ; n++ {
			b, r := pem.Decode(rest)
			if b == nil {
				break
			}
			if b.Type != "CERTIFICATE" {
				t.Fatalf("accepted a %q block", b.Type)
			}
			if _, err := x509.ParseCertificate(b.Bytes); err != nil {
				t.Fatalf("accepted block %d, not a certificate: %v", n+1, err)
			}
			rest = r
		}
		if n == 0 {
			t.Fatal("accepted a file without a certificate")
		}
		if begins := bytes.Count(data, []byte("-----BEGIN")); begins != n {
			t.Fatalf("accepted %d BEGIN lines around %d certificates", begins, n)
		}
		if len(bytes.TrimSpace(data)) == 0 || !bytes.HasPrefix(bytes.TrimSpace(data), []byte("-----BEGIN CERTIFICATE-----")) {
			t.Fatal("accepted text before the first certificate")
		}
	})
}
