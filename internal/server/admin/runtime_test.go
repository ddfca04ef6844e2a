package admin

import (
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
)

// /v1/log/level reads the level for anyone and changes it with the token
// or on the admin socket, on any replica (each has its own logs); a
// change is audited with who made it, a level that is not one is refused.
func TestLogLevel(t *testing.T) {
	f := newFixture(t)
	var level slog.LevelVar
	var entries []audit.Entry
	f.cfg.LogLevel, f.cfg.Token = &level, testToken
	f.cfg.Audit = func(e audit.Entry) { entries = append(entries, e) }
	f.cfg.IsLeader = func() bool { return false }
	h := New(f.cfg)

	rec := do(t, h, http.MethodGet, "/v1/log/level")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.JSONEq(t, `{"level":"info"}`, body(t, rec))

	rec = send(t, h, http.MethodPut, "/v1/log/level", `{"level":"debug"}`)
	assert.Equal(t, http.StatusUnauthorized, rec.Code)
	assert.Equal(t, slog.LevelInfo, level.Level(), "unchanged without the token")

	rec = send(t, h, http.MethodPut, "/v1/log/level", `{"level":"debug"}`, bearer...)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	assert.JSONEq(t, `{"level":"debug","previous":"info"}`, rec.Body.String())
	assert.Equal(t, slog.LevelDebug, level.Level())

	req := httptest.NewRequest(http.MethodPut, "/v1/log/level", strings.NewReader(`{"level":"WARN"}`))
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req.WithContext(OverSocket(req.Context())))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	assert.Equal(t, slog.LevelWarn, level.Level())

	for _, bad := range []string{`{"level":"loud"}`, `{"level":""}`, `level: debug`} {
		rec = send(t, h, http.MethodPut, "/v1/log/level", bad, bearer...)
		assert.Equal(t, http.StatusBadRequest, rec.Code, bad)
		assert.Contains(t, rec.Body.String(), "log level", bad)
	}
	assert.Equal(t, slog.LevelWarn, level.Level(), "unchanged by a refusal")

	rec = send(t, h, http.MethodPut, "/v1/log/level", `{"level":"debug"}`, "Origin", "https://evil.example", bearer[0], bearer[1])
	assert.Equal(t, http.StatusForbidden, rec.Code)

	require.Len(t, entries, 2)
	assert.Equal(t, "log_level_changed", entries[0].Event)
	assert.Equal(t, "log level info to debug by admin-token (admin API)", entries[0].Reason)
	assert.Equal(t, "log level debug to warn by admin-socket (admin API)", entries[1].Reason)
	assert.Equal(t, localTD.Name(), entries[1].TrustDomain)
}

// Without a level or a token file the routes are not mounted.
func TestRuntimeRoutesOff(t *testing.T) {
	h := New(newFixture(t).cfg)
	assert.Equal(t, http.StatusNotFound, do(t, h, http.MethodGet, "/v1/log/level").Code)
	assert.Equal(t, http.StatusNotFound, send(t, h, http.MethodPost, "/v1/bootstrap-tokens/reload", "", bearer...).Code)
}

// POST /v1/bootstrap-tokens/reload re-reads the token file with the token
// or on the socket, answering how many tokens are in force and what
// changed, or why the file did not load; the audit log records who asked
// and what came of it.
func TestReloadTokens(t *testing.T) {
	f := newFixture(t)
	var fail error
	calls := 0
	var entries []audit.Entry
	f.cfg.Token = testToken
	f.cfg.Audit = func(e audit.Entry) { entries = append(entries, e) }
	f.cfg.ReloadTokens = func() (api.TokenReload, error) {
		calls++
		return api.TokenReload{Tokens: 3, Added: 1, Removed: 2}, fail
	}
	h := New(f.cfg)

	assert.Equal(t, http.StatusUnauthorized, send(t, h, http.MethodPost, "/v1/bootstrap-tokens/reload", "").Code)
	assert.Equal(t, 0, calls)
	assert.Empty(t, entries)
	rec := send(t, h, http.MethodPost, "/v1/bootstrap-tokens/reload", "", bearer...)
	require.Equal(t, http.StatusOK, rec.Code)
	assert.JSONEq(t, `{"tokens":3,"added":1,"removed":2}`, rec.Body.String())

	fail = errors.New("--bootstrap-token-file: line 2: token repeats the one on line 1")
	rec = send(t, h, http.MethodPost, "/v1/bootstrap-tokens/reload", "", bearer...)
	assert.Equal(t, http.StatusUnprocessableEntity, rec.Code)
	assert.Contains(t, rec.Body.String(), "line 2: token repeats the one on line 1; the tokens loaded before stay in force")
	assert.Equal(t, 2, calls)

	require.Len(t, entries, 2)
	assert.Equal(t, "bootstrap_tokens_reloaded", entries[0].Event)
	assert.Equal(t, localTD.Name(), entries[0].TrustDomain)
	assert.Equal(t, "bootstrap token file reloaded by admin-token (admin API): 1 added, 2 removed, 3 in force", entries[0].Reason)
	assert.Equal(t, "bootstrap_tokens_reloaded", entries[1].Event)
	assert.Equal(t, "bootstrap token file not reloaded, by admin-token (admin API): --bootstrap-token-file: line 2: token repeats the one on line 1; the tokens loaded before stay in force", entries[1].Reason)
}
