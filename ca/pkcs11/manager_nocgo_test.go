//go:build !cgo

package pkcs11

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewWithoutCgo(t *testing.T) {
	m, err := New(Config{Module: "/usr/lib/softhsm/libsofthsm2.so", TokenLabel: "tb", PIN: "1234"})
	require.Error(t, err)
	assert.Nil(t, m)
	assert.ErrorContains(t, err, "built without cgo, which PKCS#11 needs")
	assert.ErrorContains(t, err, "make build-pkcs11 (CGO_ENABLED=1)")
}
