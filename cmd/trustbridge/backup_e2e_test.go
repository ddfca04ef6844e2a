package main

import (
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// restoreDrill is east.example on a fixed bundle endpoint address, so that
// it can be stopped, changed on disk (ca rotate, restore) and started
// again while a peer keeps polling the same URL.
type restoreDrill struct {
	t       *testing.T
	dataDir string
	addr    string // the bundle endpoint's host:port
	roots   []*x509.Certificate
	east    *e2eServer
	// published is every sequence east served, in order.
	published []uint64
}

// newRestoreDrill bootstraps east's CA (its first root is the bundle a
// peer is handed out of band) and starts it with a one-second refresh
// hint, so that a rotated root activates five seconds after it is
// published.
func newRestoreDrill(t *testing.T) *restoreDrill {
	t.Helper()
	dataDir, roots := bootstrapDataDir(t, "east.example")
	d := &restoreDrill{t: t, dataDir: dataDir, addr: servertest.ReservePort(t), roots: roots}
	d.start()
	return d
}

func (d *restoreDrill) start() {
	d.t.Helper()
	d.east = startE2EServer(d.t, "east.example", d.dataDir, func(o *server.Config) {
		o.Bundle.Listen = d.addr
		o.RefreshHint = time.Second
	})
	d.published = append(d.published, servedSequence(d.t, d.east))
}

// restart stops east, runs change on its data dir and starts it again.
func (d *restoreDrill) restart(change func()) {
	d.t.Helper()
	d.east.stop()
	change()
	d.start()
}

// cli runs trustbridge with args and requires it to succeed.
func (d *restoreDrill) cli(args ...string) string {
	d.t.Helper()
	stdout, stderr, code := runCLIAt(d.t, time.Now, "", args...)
	require.Equal(d.t, 0, code, "trustbridge %v: %s", args, stderr)
	return stdout
}

// rotate prepares a successor with ca rotate, has east publish it, and
// waits until it signs (five refresh hints later), so that the next
// rotate prepares another.
func (d *restoreDrill) rotate() {
	d.t.Helper()
	var prepared string
	d.restart(func() {
		out := d.cli("ca", "rotate", "--data-dir", d.dataDir)
		require.Contains(d.t, out, "prepared root ")
		prepared = strings.TrimSuffix(strings.Fields(out)[2], ";")
	})
	require.Eventually(d.t, func() bool {
		j, _, err := ca.NewStore(d.dataDir).Load("east.example")
		if err != nil || j == nil {
			return false
		}
		for _, r := range j.Roots {
			if r.ID == prepared {
				return r.State == castate.StateActive
			}
		}
		return false
	}, 60*time.Second, 50*time.Millisecond, "east never activated root %s", prepared)
}

func (d *restoreDrill) highest() uint64 { return slices.Max(d.published) }

// backup archives east's data dir while east runs.
func (d *restoreDrill) backup() string {
	d.t.Helper()
	archive := filepath.Join(d.t.TempDir(), "east.tar.gz")
	out := d.cli("backup", "--data-dir", d.dataDir, "--out", archive)
	require.Contains(d.t, out, "backed up trust domain east.example")
	info, err := os.Stat(archive)
	require.NoError(d.t, err)
	assert.Equal(d.t, os.FileMode(0o600), info.Mode().Perm(), "the archive holds private keys")
	return archive
}

// restore stops east, restores archive over its data dir and starts it.
func (d *restoreDrill) restore(archive string) {
	d.t.Helper()
	d.restart(func() {
		out := d.cli("restore", "--data-dir", d.dataDir, "--from", archive, "--force")
		require.Contains(d.t, out, "restored trust domain east.example")
		require.Contains(d.t, out, ".replaced-")
		keys, err := filepath.Glob(filepath.Join(d.dataDir, "ca", "roots", "*.key.pem"))
		require.NoError(d.t, err)
		require.Len(d.t, keys, 2, "the backed-up state: one root, one JWT key")
		for _, k := range keys {
			info, err := os.Stat(k)
			require.NoError(d.t, err)
			assert.Equal(d.t, os.FileMode(0o600), info.Mode().Perm(), k)
		}
	})
}

// TestRestoreOldBackupFederatedPeerAccepts is issue 21's drill: back up,
// rotate twice, restore the backup, restart. The restored server publishes
// a sequence above everything it published before, and a federated
// trustbridge polling it takes the restored bundle with no
// sequence_regression refusal at any point.
func TestRestoreOldBackupFederatedPeerAccepts(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for two root activations (5 one-second refresh hints each)")
	}
	d := newRestoreDrill(t)
	west := startE2EServer(t, "west.example", t.TempDir(), func(o *server.Config) {
		o.Federation.ConfigFile = servertest.WriteSPIFFEFederationConfig(t, "east.example", d.addr, d.roots)
	})
	waitHolds := func(seq uint64, roots int) api.FederationStatus {
		t.Helper()
		var st api.FederationStatus
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			var err error
			st, err = peerStatus(west, "east.example")
			if !assert.NoError(c, err) || !assert.NotNil(c, st.Sequence, "west holds no bundle of east") {
				return
			}
			assert.Equal(c, seq, *st.Sequence)
			assert.Len(c, x509Held(st.Authorities), roots)
		}, 60*time.Second, 20*time.Millisecond, "west holds east's sequence %d with %d roots", seq, roots)
		return st
	}
	waitHolds(d.highest(), 1)

	archive := d.backup()
	d.rotate()
	waitHolds(d.highest(), 2)
	d.rotate()
	waitHolds(d.highest(), 3)
	before := d.highest()

	d.restore(archive)
	restored := d.published[len(d.published)-1]
	assert.Greater(t, restored, before, "the restored state is published above everything before it: %v", d.published)
	st := waitHolds(restored, 1)
	assert.Equal(t, string(federation.StateOK), st.State)
	assert.Equal(t, servertest.SHA256Hex(d.roots[0].Raw), x509Held(st.Authorities)[0].SHA256, "west trusts the restored root")
	assert.NotContains(t, st.Refusals, "sequence_regression", "west never refused a bundle as a regression: %v", st.Refusals)
	assert.NotContains(t, st.Refusals, "sequence_conflict", "%v", st.Refusals)
	for i := 1; i < len(d.published); i++ {
		assert.Greater(t, d.published[i], d.published[i-1], "every start and rotation published a higher sequence: %v", d.published)
	}
}

// peerStatus reads s's GET /v1/federation entry for td.
func peerStatus(s *e2eServer, td string) (api.FederationStatus, error) {
	resp, err := http.Get(s.admin + "/v1/federation")
	if err != nil {
		return api.FederationStatus{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return api.FederationStatus{}, fmt.Errorf("GET /v1/federation: %s", resp.Status)
	}
	var all []api.FederationStatus
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&all); err != nil {
		return api.FederationStatus{}, err
	}
	for _, st := range all {
		if st.TrustDomain == td {
			return st, nil
		}
	}
	return api.FederationStatus{}, fmt.Errorf("no status for %s yet", td)
}
