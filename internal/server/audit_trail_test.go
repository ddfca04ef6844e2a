package server

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/audit"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// fullDisk accepts a number of writes, then fails as a full disk does.
type fullDisk struct{ left int }

func (d *fullDisk) Write(p []byte) (int, error) {
	if d.left == 0 {
		return 0, errors.New("no space left on device")
	}
	d.left--
	return len(p), nil
}

// An audit entry that cannot be written is reported three ways: the
// error log, trustbridge_audit_write_failures_total, and no head advance;
// the next entry that fits continues the chain.
func TestAuditTrailReportsWriteFailures(t *testing.T) {
	disk := &fullDisk{left: 1}
	l := audit.New(disk)
	var logs testlog.Buffer
	trail, err := newAuditTrail(l, "replica-1", nil, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)

	trail.record(audit.Entry{Event: "baseline", TrustDomain: "west.example"})
	head, n := l.Head()
	require.Equal(t, uint64(1), n)

	trail.record(audit.Entry{Event: "bundle_accepted", TrustDomain: "east.example"})
	assert.Equal(t, 1.0, testutil.ToFloat64(trail.failures))
	assert.Contains(t, logs.String(), "level=ERROR")
	assert.Contains(t, logs.String(), "audit entry not written")
	assert.Contains(t, logs.String(), "no space left on device")
	gotHead, gotN := l.Head()
	assert.Equal(t, head, gotHead, "the chain still ends at the last entry written")
	assert.Equal(t, n, gotN)

	disk.left = 1
	trail.record(audit.Entry{Event: "bundle_accepted", TrustDomain: "east.example"})
	_, n = l.Head()
	assert.Equal(t, uint64(2), n)
	assert.Equal(t, 1.0, testutil.ToFloat64(trail.appended.WithLabelValues("bundle_accepted")))
}
