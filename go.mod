module github.com/trustbridge/trustbridge

go 1.26.8

require (
	github.com/go-jose/go-jose/v4 v4.1.8
	github.com/spf13/cobra v1.10.2
	github.com/spiffe/go-spiffe/v2 v2.9.0
	github.com/stretchr/testify v1.12.1
	go.yaml.in/yaml/v3 v3.0.5
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
)
