package federation

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
)

// transitions are the "federation state changed" records in logs.
func transitions(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		if rec["msg"] == "federation state changed" {
			out = append(out, rec)
		}
	}
	return out
}

// Every state change is logged once, with its reason; polls that leave
// the state as it was log no transition.
func TestPollerLogsStateTransitionsOnce(t *testing.T) {
	var logs testlog.Buffer
	pf := newPollFixture(t)
	pf.logger = slog.New(slog.NewJSONHandler(&logs, nil))
	p := pf.poller(t)
	td := pf.ep.TrustDomain
	fail := func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }

	steps := []struct {
		name    string
		handler http.HandlerFunc
		advance time.Duration
		polls   int
		from    State
		to      State
		level   string
		reason  string
	}{
		{"first bundle", serveDoc(pf.fx.doc), 0, 2, StatePending, StateOK, "INFO", "bundle fetched (sequence 7)"},
		{"endpoint down", fail, 0, 2, StateOK, StateFailing, "WARN", "503"},
		{"down for three refresh intervals", fail, 16 * time.Minute, 2, StateFailing, StateStale, "ERROR", "no successful poll for 3 refresh intervals"},
		{"back", serveDoc(docWith(t, pf.fx.bundle, 8)), 0, 2, StateStale, StateOK, "INFO", "bundle fetched (sequence 8)"},
	}
	for i, step := range steps {
		pf.srv.set(step.handler)
		pf.now = pf.now.Add(step.advance)
		for range step.polls {
			_ = p.Refresh(t.Context(), td)
		}
		require.Equal(t, step.to, p.Status()[0].State, step.name)
		got := transitions(t, logs.String())
		require.Len(t, got, i+1, "%s: one record per change, none for a poll that changes nothing\n%s", step.name, logs.String())
		rec := got[i]
		assert.Equal(t, string(step.from), rec["from"], step.name)
		assert.Equal(t, string(step.to), rec["to"], step.name)
		assert.Equal(t, step.level, rec["level"], step.name)
		assert.Contains(t, rec["reason"], step.reason, step.name)
		assert.Equal(t, td.Name(), rec["trust_domain"], step.name)
		assert.Equal(t, pf.ep.URL.String(), rec["endpoint_url"], step.name)
	}

	// A changed configuration (a reload, federation add --force, a
	// resource edit) of a peer that stays ok is no transition.
	changed := pf.ep
	u := *pf.ep.URL
	u.RawQuery = "moved=1"
	changed.URL = &u
	require.NoError(t, p.SetEndpoints([]Endpoint{changed}))
	for range 2 {
		_ = p.Refresh(t.Context(), td)
	}
	require.Equal(t, StateOK, p.Status()[0].State)
	assert.Len(t, transitions(t, logs.String()), len(steps), "no pending→ok record for a peer that was ok\n%s", logs.String())
}
