package server

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/trustbridge/trustbridge/internal/caclient"
)

// The certificate service serves the ID the shared client expects.
func TestGRPCServingPathIsCAClientServerPath(t *testing.T) {
	assert.Equal(t, caclient.ServerPath, GRPCServingPath)
}
