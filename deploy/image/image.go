package main

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// What deploy/Dockerfile's image has too (its test checks both agree):
// distroless' nonroot user, the binary as the entrypoint.
const (
	Entrypoint = "/usr/local/bin/trustbridge"
	User       = "65532:65532"
	uid, gid   = 65532, 65532
	homeDir    = "/home/nonroot"
	caCertPath = "/etc/ssl/certs/ca-certificates.crt"
)

// Spec is what goes into the image.
type Spec struct {
	// Binary is the static trustbridge executable (CGO_ENABLED=0).
	Binary []byte
	// CACerts are PEM certificates for /etc/ssl/certs, where Go's
	// crypto/x509 finds the system roots https_web federation and ACME
	// verify servers with; nil leaves them out.
	CACerts []byte
	// Arch is the binary's GOARCH.
	Arch string
	// Created stamps the config and every file, so that the same inputs
	// give the same image digest.
	Created time.Time
	// Labels are the config's labels (org.opencontainers.image.*).
	Labels map[string]string
}

// file is one entry of the image's only layer.
type file struct {
	name     string
	mode     int64
	uid, gid int
	dir      bool
	data     []byte
}

// files are the layer's entries: what a static Go binary needs from a
// root file system, no more (no shell, no package manager).
func (s Spec) files() []file {
	passwd := "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group := "root:x:0:\nnonroot:x:65532:\n"
	fs := []file{
		{name: "etc", mode: 0o755, dir: true},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "home", mode: 0o755, dir: true},
		{name: "home/nonroot", mode: 0o700, uid: uid, gid: gid, dir: true},
		{name: "tmp", mode: 0o1777, dir: true},
		{name: "usr", mode: 0o755, dir: true},
		{name: "usr/local", mode: 0o755, dir: true},
		{name: "usr/local/bin", mode: 0o755, dir: true},
		{name: Entrypoint[1:], mode: 0o755, data: s.Binary},
	}
	if s.CACerts != nil {
		fs = append(fs,
			file{name: "etc/ssl", mode: 0o755, dir: true},
			file{name: "etc/ssl/certs", mode: 0o755, dir: true},
			file{name: caCertPath[1:], mode: 0o644, data: s.CACerts})
	}
	return fs
}

// layerTar writes the files as an uncompressed tar.
func (s Spec) layerTar() ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range s.files() {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.gid, ModTime: s.Created, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag, h.Name = tar.TypeDir, f.name+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// checkCACerts refuses anything but PEM certificates, each parseable,
// with only whitespace between them: a private key concatenated into the
// file by mistake must not ship in the image, whole or truncated (a lone
// "-----BEGIN PRIVATE KEY-----" line, or its base64, between two
// certificates). pem.Decode alone skips any text that is not a complete
// block, so each block is cut out here first. Errors name a line, never
// quote it: it may be key material.
func checkCACerts(data []byte) error {
	const begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
	n := 0
	for rest := bytes.TrimLeft(data, pemSpace); len(rest) > 0; rest = bytes.TrimLeft(rest, pemSpace) {
		line := bytes.Count(data[:len(data)-len(rest)], []byte("\n")) + 1
		if !bytes.HasPrefix(rest, []byte(begin)) {
			return fmt.Errorf("line %d: not a %s line; the file must hold only PEM certificates, with only whitespace between them (remove comment lines, keys and anything else)", line, begin)
		}
		i := bytes.Index(rest, []byte(end))
		if i < 0 {
			return fmt.Errorf("line %d: certificate %d has no %s line", line, n+1, end)
		}
		// The block ends with its END line's line break.
		j := i + len(end)
		if k := bytes.IndexByte(rest[j:], '\n'); k >= 0 {
			j += k + 1
		} else {
			j = len(rest)
		}
		chunk := rest[:j]
		// One BEGIN only: pem.Decode would skip a broken first block and
		// return the next one.
		b, after := pem.Decode(chunk)
		if b == nil || bytes.Count(chunk, []byte("-----BEGIN")) != 1 || len(bytes.TrimLeft(after, pemSpace)) != 0 {
			return fmt.Errorf("line %d: certificate %d is not a well-formed PEM block", line, n+1)
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("line %d: certificate %d: %w", line, n+1, err)
		}
		n++
		rest = rest[j:]
	}
	if n == 0 {
		return errors.New("no PEM certificate in it")
	}
	return nil
}

// pemSpace is the whitespace allowed around certificates.
const pemSpace = " \t\r\n"

// Build assembles the image: one layer on an empty base, OCI media types,
// the non-root user and the binary as the entrypoint.
func Build(s Spec) (v1.Image, error) {
	if len(s.Binary) == 0 {
		return nil, errors.New("image: the binary is empty")
	}
	if s.CACerts != nil {
		if err := checkCACerts(s.CACerts); err != nil {
			return nil, fmt.Errorf("image: CA certificates: %w", err)
		}
	}
	raw, err := s.layerTar()
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{Created: v1.Time{Time: s.Created}, CreatedBy: "trustbridge make image"}})
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Created = "linux", s.Arch, v1.Time{Time: s.Created}
	cfg.Config.User, cfg.Config.Entrypoint, cfg.Config.WorkingDir = User, []string{Entrypoint}, homeDir
	cfg.Config.Env = []string{"PATH=/usr/local/bin"}
	cfg.Config.Labels = s.Labels
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	return img, nil
}

// WriteLayout writes img as an OCI image layout in one tar archive (what
// `docker load`, `podman load` and `skopeo copy oci-archive:` read), its
// index naming it ref (e.g. ghcr.io/trustbridge/trustbridge:v0.1.0).
func WriteLayout(w io.Writer, img v1.Image, ref, tag string) error {
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	index, err := json.Marshal(v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: []v1.Descriptor{{
		MediaType: types.OCIManifestSchema1, Size: int64(len(manifest)), Digest: digest,
		Annotations: map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": tag},
	}}})
	if err != nil {
		return err
	}
	blobs, err := imageBlobs(img)
	if err != nil {
		return err
	}
	blobs[digest] = manifest
	tw := tar.NewWriter(w)
	put := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := put("index.json", index); err != nil {
		return err
	}
	for _, d := range sortedDigests(blobs) {
		if err := put(path.Join("blobs", d.Algorithm, d.Hex), blobs[d]); err != nil {
			return err
		}
	}
	return tw.Close()
}

// imageBlobs are the config and the compressed layers, by digest.
func imageBlobs(img v1.Image) (map[v1.Hash][]byte, error) {
	cfgName, err := img.ConfigName()
	if err != nil {
		return nil, err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return nil, err
	}
	blobs := map[v1.Hash][]byte{cfgName: cfg}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, err
		}
		rc, err := l.Compressed()
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(rc)
		_ = rc.Close()
		if err != nil {
			return nil, err
		}
		blobs[d] = data
	}
	return blobs, nil
}

func sortedDigests(m map[v1.Hash][]byte) []v1.Hash {
	ds := slices.Collect(maps.Keys(m))
	slices.SortFunc(ds, func(a, b v1.Hash) int { return strings.Compare(a.String(), b.String()) })
	return ds
}

// writeFileAtomic writes the file through a temporary file renamed over
// it, so a failed build never leaves half an image behind.
func writeFileAtomic(name string, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(name), ".image-*.tar")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if err := write(tmp); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), name)
}
