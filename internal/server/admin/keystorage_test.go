package admin

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
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

// TestSnapshotCAStatus: the snapshot's ca section carries the leaf
// lifetimes and, in upstream mode, the upstream's health, which the
// audit's upstream findings read.
func TestSnapshotCAStatus(t *testing.T) {
	t.Parallel()
	f := newJWTFixture(t)
	assert.Nil(t, New(f.cfg).Snapshot().CA, "no lifetimes given: no section")

	ok := time.Date(2026, 11, 28, 1, 0, 0, 0, time.FixedZone("x", 3600))
	f.cfg.WorkloadTTL, f.cfg.MaxWorkloadTTL = time.Hour, 24*time.Hour
	f.cfg.Upstream = func() (ca.UpstreamStatus, bool) {
		return ca.UpstreamStatus{Name: "trustbridge upstream corp:15012", LastSuccess: ok, LastError: "refused", Failures: 2, FailingSince: ok.Add(time.Hour)}, true
	}
	st := New(f.cfg).Snapshot().CA
	require.NotNil(t, st)
	assert.Equal(t, int64(3600), st.WorkloadTTLSeconds)
	assert.Equal(t, int64(86400), st.MaxWorkloadTTLSeconds)
	require.NotNil(t, st.Upstream)
	assert.Equal(t, "trustbridge upstream corp:15012", st.Upstream.Name)
	require.NotNil(t, st.Upstream.LastSuccess)
	assert.True(t, st.Upstream.LastSuccess.Equal(ok))
	assert.Equal(t, time.UTC, st.Upstream.LastSuccess.Location())
	assert.Nil(t, st.Upstream.LastErrorAt, "a zero time is left out")
	assert.Equal(t, "refused", st.Upstream.LastError)
	assert.Equal(t, 2, st.Upstream.Failures)
	require.NotNil(t, st.Upstream.FailingSince)
	assert.True(t, st.Upstream.FailingSince.Equal(ok.Add(time.Hour)))

	f.cfg.Upstream = func() (ca.UpstreamStatus, bool) { return ca.UpstreamStatus{}, false }
	assert.Nil(t, New(f.cfg).Snapshot().CA.Upstream, "no upstream section outside upstream mode")
}
