// Builds trustbridge's container image without a container engine
// (make image): an OCI image layout tarball from a static binary. A module
// of its own so that go-containerregistry never enters trustbridge's
// dependency graph.
module github.com/trustbridge/trustbridge/deploy/image

go 1.26.8

require (
	github.com/google/go-containerregistry v0.21.6
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/klauspost/compress v1.18.6 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.20.0 // indirect
)
