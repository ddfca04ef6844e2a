// Command image builds trustbridge's container image without a container
// engine or network access: a static binary, a minimal /etc/passwd with the
// nonroot user (uid 65532), the CA certificates Go reads system roots from,
// on an empty base, written as an OCI image layout tar archive.
//
//	make image   # bin/trustbridge-image.tar
//	docker load -i bin/trustbridge-image.tar    # or podman load, skopeo copy oci-archive:...
//
// deploy/Dockerfile builds the same image where a container engine exists
// (same user, same entrypoint; image_test.go checks both agree).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	binary := fs.String("binary", "", "static trustbridge binary (CGO_ENABLED=0) to put at "+Entrypoint)
	caCerts := fs.String("ca-certs", "", "PEM CA certificates to put at "+caCertPath+", which replace the binary's embedded roots for https_web federation and ACME (default: none)")
	out := fs.String("out", "", "OCI image layout tar archive to write")
	repo := fs.String("repository", "ghcr.io/trustbridge/trustbridge", "image name recorded in the archive's index")
	version := fs.String("version", "dev", "image tag and org.opencontainers.image.version")
	revision := fs.String("revision", "", "org.opencontainers.image.revision (the commit)")
	source := fs.String("source", "https://github.com/trustbridge/trustbridge", "org.opencontainers.image.source")
	created := fs.Int64("created", 0, "creation time, Unix seconds (e.g. the commit's), for reproducible digests")
	arch := fs.String("arch", runtime.GOARCH, "GOARCH the binary was built for")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *binary == "" || *out == "" {
		return fmt.Errorf("-binary and -out are required")
	}
	spec := Spec{Arch: *arch, Created: time.Unix(*created, 0).UTC(), Labels: map[string]string{
		"org.opencontainers.image.title":    "trustbridge",
		"org.opencontainers.image.version":  *version,
		"org.opencontainers.image.revision": *revision,
		"org.opencontainers.image.source":   *source,
		"org.opencontainers.image.created":  time.Unix(*created, 0).UTC().Format(time.RFC3339),
	}}
	var err error
	if spec.Binary, err = os.ReadFile(*binary); err != nil {
		return err
	}
	if *caCerts != "" {
		if spec.CACerts, err = os.ReadFile(*caCerts); err != nil {
			return fmt.Errorf("-ca-certs: %w (leave it empty: the binary carries its own roots)", err)
		}
	}
	img, err := Build(spec)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(*out, func(w io.Writer) error { return WriteLayout(w, img, *repo+":"+*version, *version) }); err != nil {
		return err
	}
	return report(img, *out)
}

func report(img v1.Image, out string) error {
	d, err := img.Digest()
	if err != nil {
		return err
	}
	st, err := os.Stat(out)
	if err != nil {
		return err
	}
	fmt.Printf("wrote %s (%s bytes): %s, user %s, entrypoint %s\n", out, strconv.FormatInt(st.Size(), 10), d, User, Entrypoint)
	return nil
}
