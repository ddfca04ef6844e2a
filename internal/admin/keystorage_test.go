package admin

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSnapshotKeyStorage: our own roots and JWT keys say where their
// private keys are, and the snapshot carries --require-hsm.
func TestSnapshotKeyStorage(t *testing.T) {
	t.Parallel()
	f := newJWTFixture(t)
	f.ca.roots[1].KeyRef = "ref-1"
	f.cfg.KeyManager, f.cfg.RequireHSM = `pkcs11 token "tb" (libsofthsm2.so)`, true
	snap := New(f.cfg).Snapshot()
	assert.True(t, snap.RequireHSM)
	local, peer := snap.TrustDomains[0], snap.TrustDomains[1]
	byState := map[string]string{}
	for _, a := range local.Authorities {
		if a.Kind == "x509" {
			byState[a.State] = a.KeyStorage
		}
	}
	assert.Equal(t, map[string]string{"active": "state", "prepared": `pkcs11 token "tb" (libsofthsm2.so)`}, byState)
	assert.Equal(t, "state", authorityByKID(t, local, "k-active").KeyStorage)
	require.NotEmpty(t, peer.Authorities)
	for _, a := range peer.Authorities {
		assert.Empty(t, a.KeyStorage, "only our own keys have a storage")
	}
}
