package trustbridge_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/upstream/trustbridge"
	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// FuzzParseResponse: whatever an upstream answers, ParseResponse returns
// an error or a bounded, non-empty chain and roots.
func FuzzParseResponse(f *testing.F) {
	a, err := ca.New(ca.Config{TrustDomain: td, DataDir: f.TempDir()})
	require.NoError(f, err)
	root := a.Bundle().X509Authorities()[0].Raw
	for _, resp := range []*identityapi.SignIntermediateResponse{
		{},
		{CertChain: [][]byte{root}, Roots: [][]byte{root}},
		{CertChain: [][]byte{root}},
		{CertChain: [][]byte{root[:10]}, Roots: [][]byte{root}},
		{CertChain: make([][]byte, trustbridge.MaxChainCerts+1), Roots: [][]byte{root}},
	} {
		b, err := proto.Marshal(resp)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		var resp identityapi.SignIntermediateResponse
		if proto.Unmarshal(wire, &resp) != nil {
			return
		}
		got, err := trustbridge.ParseResponse(&resp)
		if err != nil {
			return
		}
		assert.NotEmpty(t, got.Chain)
		assert.LessOrEqual(t, len(got.Chain), trustbridge.MaxChainCerts)
		assert.NotEmpty(t, got.Roots)
		assert.LessOrEqual(t, len(got.Roots), trustbridge.MaxRoots)
	})
}
