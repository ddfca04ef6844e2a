package admin

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// fakeAuthorities is a CA with an active root 01, a retired one 00, a
// prepared one 02 published an hour before t0, and JWT keys k-active and
// k-old (retired). Changes apply as the CA applies them, without its
// checks: err, when set, is the answer instead.
type fakeAuthorities struct {
	err error

	mu      sync.Mutex
	roots   []ca.RootInfo
	keys    []ca.JWTKeyInfo
	changes []ca.AuthorityChange
}

func newFakeAuthorities(t *testing.T) *fakeAuthorities {
	t.Helper()
	rec := func(id string, st castate.RootState) ca.RootInfo {
		c := testca.New(t, localTD.Name())
		return ca.RootInfo{RootRecord: castate.RootRecord{ID: id, State: st, CertSHA256: "sha-" + id, PreparedAt: t0.Add(-48 * time.Hour)}, Cert: c.Cert}
	}
	old, active, next := rec("00", castate.StateRetired), rec("01", castate.StateActive), rec("02", castate.StatePrepared)
	old.RetiredAt = t0.Add(-24 * time.Hour)
	active.ActivatedAt = t0.Add(-24 * time.Hour)
	next.PreparedAt, next.PublishedAt = t0.Add(-time.Hour), t0.Add(-time.Hour)
	key := func(kid string, st castate.RootState) ca.JWTKeyInfo {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		return ca.JWTKeyInfo{JWTKeyRecord: castate.JWTKeyRecord{KID: kid, State: st, Algorithm: "ES256", CreatedAt: t0.Add(-time.Hour),
			NotAfter: t0.Add(24 * time.Hour), PreparedAt: t0.Add(-time.Hour), PublishedAt: t0.Add(-time.Hour)}, Public: k.Public()}
	}
	return &fakeAuthorities{roots: []ca.RootInfo{old, active, next},
		keys: []ca.JWTKeyInfo{key("k-old", castate.StateRetired), key("k-active", castate.StateActive)}}
}

func (f *fakeAuthorities) Roots() []ca.RootInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]ca.RootInfo(nil), f.roots...)
}

func (f *fakeAuthorities) JWTKeys() []ca.JWTKeyInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]ca.JWTKeyInfo(nil), f.keys...)
}

func (f *fakeAuthorities) ChangeAuthority(c ca.AuthorityChange) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.changes = append(f.changes, c)
	if f.err != nil {
		return "", f.err
	}
	id := c.ID
	if id == "" {
		id = "02"
	}
	for i := range f.roots {
		if r := &f.roots[i]; r.ID == id && !c.JWT {
			switch c.Action {
			case "activate":
				r.State, r.ActivatedAt = castate.StateActive, t0
			case "taint":
				r.TaintedAt = t0
			case "revoke":
				r.State, r.RevokedAt = castate.StateRevoked, t0
			}
			return id, nil
		}
	}
	for i := range f.keys {
		if k := &f.keys[i]; k.KID == id && c.JWT {
			if c.Action == "taint" {
				k.TaintedAt = t0
			}
			return id, nil
		}
	}
	return "", fmt.Errorf("ca: %w: %q", castate.ErrAuthorityNotFound, id)
}

func (f *fakeAuthorities) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.changes)
}

// authorityFixture is the admin API over fakeAuthorities, recording its
// audit entries.
type authorityFixture struct {
	*fixture
	auth    *fakeAuthorities
	mu      sync.Mutex
	entries []audit.Entry
}

func newAuthorityFixture(t *testing.T) *authorityFixture {
	t.Helper()
	f := &authorityFixture{fixture: newFixture(t), auth: newFakeAuthorities(t)}
	f.cfg.Authorities, f.cfg.Token, f.cfg.TokenFile = f.auth, testToken, "/data/admin.token"
	f.cfg.Audit = func(e audit.Entry) { f.mu.Lock(); f.entries = append(f.entries, e); f.mu.Unlock() }
	return f
}

func (f *authorityFixture) audited() []audit.Entry {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]audit.Entry(nil), f.entries...)
}

// skid is the key the ledger counts root id's leaves under.
func (f *authorityFixture) skid(id string) string {
	for _, r := range f.auth.Roots() {
		if r.ID == id {
			return "x509:" + hex.EncodeToString(r.Cert.SubjectKeyId)
		}
	}
	return ""
}

func change(t *testing.T, h http.Handler, body string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	return send(t, h, http.MethodPost, "/v1/ca/authorities", body, header...)
}

func TestAuthorityList(t *testing.T) {
	t.Parallel()
	f := newAuthorityFixture(t)
	h := New(f.cfg)
	var got api.CAAuthorities
	require.NoError(t, json.Unmarshal([]byte(body(t, do(t, h, http.MethodGet, "/v1/ca/authorities"))), &got))
	assert.Equal(t, localTD.Name(), got.TrustDomain)
	assert.Equal(t, uint64(7), got.Sequence)
	require.Len(t, got.X509, 3)
	require.Len(t, got.JWT, 2)
	next := got.X509[2]
	assert.Equal(t, "02", next.ID)
	assert.Equal(t, api.CAKindRoot, next.Kind)
	require.NotNil(t, next.ActivatesAt, "a published prepared root says when it signs")
	assert.Equal(t, t0.Add(-time.Hour).Add(ca.PublishLead*5*time.Minute), *next.ActivatesAt, "5 refresh hints of the bundle after publication")
	assert.NotEmpty(t, next.SubjectKeyID)
	assert.Nil(t, next.Signed, "nothing counted without Signed")
	assert.Nil(t, got.SignedSince)
	assert.Equal(t, api.CAKindJWT, got.JWT[1].Kind)
	assert.Equal(t, "ES256", got.JWT[1].Algorithm)

	f.cfg.Signed = func() (map[string]api.SignedCount, time.Time) {
		return map[string]api.SignedCount{f.skid("01"): {Live: 3, InUse: 2, Last: t0.Add(time.Hour)}, "jwt:k-active": {Live: 1, InUse: 1}}, t0.Add(-48 * time.Hour)
	}
	require.NoError(t, json.Unmarshal([]byte(body(t, do(t, New(f.cfg), http.MethodGet, "/v1/ca/authorities"))), &got))
	require.NotNil(t, got.SignedSince)
	assert.Equal(t, &api.SignedCount{Live: 3, InUse: 2, Last: t0.Add(time.Hour)}, got.X509[1].Signed, "counted since before it signed: complete")
	assert.Equal(t, &api.SignedCount{}, got.X509[0].Signed, "an authority the ledger does not name signed nothing live")
	assert.Equal(t, 1, got.JWT[1].Signed.InUse)

	// Counting began after the root began signing (a restart), another
	// replica signs too, the ledger dropped some: zero proves nothing.
	f.cfg.Signed = func() (map[string]api.SignedCount, time.Time) { return nil, t0.Add(-time.Hour) }
	f.cfg.IsLeader = func() bool { return true }
	f.cfg.SignedIncomplete = func() string { return "the ledger dropped 3" }
	require.NoError(t, json.Unmarshal([]byte(body(t, do(t, New(f.cfg), http.MethodGet, "/v1/ca/authorities"))), &got))
	why := got.X509[1].Signed.Incomplete
	assert.Contains(t, why, "before this replica began counting at "+t0.Add(-time.Hour).Format(time.RFC3339))
	assert.Contains(t, why, "every replica signs and counts only its own")
	assert.Contains(t, why, "the ledger dropped 3")
}

func TestAuthorityChange(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		body   string
		err    error
		header []string
		want   int
		msg    string
		event  string
	}{
		{"prepare waits already", `{"action":"prepare"}`, nil, bearer, http.StatusOK, "root 02 was already prepared", ""},
		{"activate the prepared one", `{"action":"activate","now":true}`, nil, bearer, http.StatusOK, "activated root 02", "ca_authority_activated"},
		{"taint", `{"action":"taint","id":"00"}`, nil, bearer, http.StatusOK, "tainted root 00", "ca_authority_tainted"},
		{"taint a JWT key", `{"action":"taint","jwt":true,"id":"k-old"}`, nil, bearer, http.StatusOK, "tainted JWT key k-old", "ca_authority_tainted"},
		{"revoke", `{"action":"revoke","id":"00"}`, nil, bearer, http.StatusOK, "revoked root 00", "ca_authority_revoked"},
		{"refused", `{"action":"taint","id":"01"}`, fmt.Errorf("ca: %w: root 01 is active", castate.ErrAuthorityState), bearer, http.StatusConflict, "root 01 is active", ""},
		{"not found", `{"action":"taint","id":"ff"}`, fmt.Errorf("ca: %w: no ff", castate.ErrAuthorityNotFound), bearer, http.StatusNotFound, "no ff", ""},
		{"CA not leading", `{"action":"prepare"}`, fmt.Errorf("ca: %w", castate.ErrNotLeader), bearer, http.StatusConflict, "", ""},
		{"CA failing", `{"action":"prepare"}`, fmt.Errorf("ca: disk full"), bearer, http.StatusInternalServerError, "disk full", ""},
		{"unknown field", `{"action":"taint","id":"00","reason":"x"}`, nil, bearer, http.StatusBadRequest, "unknown field", ""},
		{"unknown action", `{"action":"destroy"}`, nil, bearer, http.StatusBadRequest, `action "destroy"`, ""},
		{"not JSON", `taint 00`, nil, bearer, http.StatusBadRequest, "authority change", ""},
		{"two values", `{"action":"taint","id":"00"}{}`, nil, bearer, http.StatusBadRequest, "more than one", ""},
		{"too large", `{"action":"taint","id":"` + strings.Repeat("0", maxAuthorityBody) + `"}`, nil, bearer, http.StatusRequestEntityTooLarge, "", ""},
		{"no token", `{"action":"taint","id":"00"}`, nil, nil, http.StatusUnauthorized, "missing admin token", ""},
		{"cross-site", `{"action":"taint","id":"00"}`, nil, append([]string{"Origin", "https://evil.example"}, bearer...), http.StatusForbidden, "cross-site", ""},
		{"follower", `{"action":"taint","id":"00"}`, nil, bearer, http.StatusConflict, "not the leader", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newAuthorityFixture(t)
			f.auth.err = tt.err
			f.auth.roots[0].TaintedAt = t0.Add(-time.Minute) // 00 may be revoked
			if tt.name == "follower" {
				f.cfg.IsLeader = func() bool { return false }
			}
			rec := change(t, New(f.cfg), tt.body, tt.header...)
			assert.Equal(t, tt.want, rec.Code, rec.Body.String())
			assert.Contains(t, rec.Body.String(), tt.msg)
			if tt.want >= 400 && tt.err == nil {
				assert.Zero(t, f.auth.calls(), "the CA is not asked")
			}
			entries := f.audited()
			if tt.event == "" {
				assert.Empty(t, entries, "nothing changed, nothing audited")
				return
			}
			require.Len(t, entries, 1)
			assert.Equal(t, tt.event, entries[0].Event)
			assert.Contains(t, entries[0].Reason, "by admin-token (admin API)")
		})
	}
}

func TestAuthorityChangeAudit(t *testing.T) {
	t.Parallel()
	f := newAuthorityFixture(t)
	h := New(f.cfg)
	f.auth.roots[0].TaintedAt = t0
	socket := func(body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/ca/authorities", strings.NewReader(body))
		req = req.WithContext(OverSocket(req.Context()))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	require.Equal(t, http.StatusOK, socket(`{"action":"activate","id":"02","now":true}`).Code)
	require.Equal(t, http.StatusOK, socket(`{"action":"revoke","id":"00"}`).Code)
	entries := f.audited()
	require.Len(t, entries, 2)
	assert.Equal(t, "ca_authority_activated", entries[0].Event)
	assert.Equal(t, localTD.Name(), entries[0].TrustDomain)
	assert.Contains(t, entries[0].Reason, "root 02 by admin-socket (admin API) [x509:sha-02]: activated early with --now")
	assert.Equal(t, "ca_authority_revoked", entries[1].Event)
	assert.Equal(t, []string{"x509:sha-00"}, entries[1].Removed)
	require.NotNil(t, entries[1].NewSequence)
}

func TestAuthorityRevokeWhileInUse(t *testing.T) {
	t.Parallel()
	f := newAuthorityFixture(t)
	f.auth.roots[0].TaintedAt = t0
	f.cfg.Signed = func() (map[string]api.SignedCount, time.Time) {
		return map[string]api.SignedCount{f.skid("00"): {Live: 5, InUse: 4, Last: t0.Add(time.Hour)}}, t0.Add(-time.Hour)
	}
	h := New(f.cfg)
	rec := change(t, h, `{"action":"revoke","id":"00"}`, bearer...)
	assert.Equal(t, http.StatusConflict, rec.Code)
	assert.Contains(t, rec.Body.String(), "root 00: 4 workloads still present what it signed (the last of it expires at 2026-11-22T13:00:00Z)")
	assert.Contains(t, rec.Body.String(), "--force")
	assert.Zero(t, f.auth.calls(), "the CA is not asked")

	rec = change(t, h, `{"action":"revoke","id":"00","force":true}`, bearer...)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var res api.CAAuthorityResult
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &res))
	assert.Equal(t, "revoked", res.Authority.State)
	require.NotNil(t, res.Authority.RevokedAt)
	entries := f.audited()
	require.Len(t, entries, 1)
	assert.Contains(t, entries[0].Reason, "revoked with --force while 4 workloads still presented what it signed")
}

// TestAuthorityRevokeWhenCountsCannotVouch: nothing counted in use, but
// counting began after the root began signing (a restart): revoke wants
// --force, saying why.
func TestAuthorityRevokeWhenCountsCannotVouch(t *testing.T) {
	t.Parallel()
	f := newAuthorityFixture(t)
	f.auth.roots[0].TaintedAt = t0
	f.cfg.Signed = func() (map[string]api.SignedCount, time.Time) { return nil, t0.Add(-time.Hour) }
	h := New(f.cfg)
	rec := change(t, h, `{"action":"revoke","id":"00"}`, bearer...)
	assert.Equal(t, http.StatusConflict, rec.Code)
	assert.Contains(t, rec.Body.String(), "root 00: this server cannot tell whether workloads still present what it signed (it signed from")
	assert.Contains(t, rec.Body.String(), "before this replica began counting")
	assert.Zero(t, f.auth.calls(), "the CA is not asked")
	rec = change(t, h, `{"action":"revoke","id":"00","force":true}`, bearer...)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
}

func TestAuthorityActivateNamesUnseenPeers(t *testing.T) {
	t.Parallel()
	f := newAuthorityFixture(t)
	rec := change(t, New(f.cfg), `{"action":"activate","now":true}`, bearer...)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var res api.CAAuthorityResult
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &res))
	assert.Equal(t, "active", res.Authority.State)
	require.Len(t, res.Warnings, 1)
	assert.Contains(t, res.Warnings[0], "fetches of our bundle are not tracked here")

	f = newAuthorityFixture(t)
	f.cfg.Fetchers = func() []api.BundleFetcher {
		return []api.BundleFetcher{
			{Client: "spiffe://west.example/trustbridge", LastFetch: t0.Add(-2 * time.Hour), Sequence: 6},
			{Client: "spiffe://north.example/trustbridge", LastFetch: t0.Add(-time.Minute), Sequence: 7},
			{Client: "192.0.2.7:4431", LastFetch: t0.Add(-3 * time.Hour), Sequence: 5},
		}
	}
	rec = change(t, New(f.cfg), `{"action":"activate","id":"02","now":true}`, bearer...)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	res = api.CAAuthorityResult{}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &res))
	require.Len(t, res.NotSeen, 2, "north.example fetched after publication")
	assert.Equal(t, "192.0.2.7:4431", res.NotSeen[0].Client)
	assert.Equal(t, "spiffe://west.example/trustbridge", res.NotSeen[1].Client)
	require.Len(t, res.Warnings, 2)
	assert.Contains(t, res.Warnings[1], "spiffe://west.example/trustbridge last fetched our bundle at 2026-11-22T10:00:00Z (sequence 6), before root 02 was published")

	// A replica started after the publication, one of several: it says
	// what its record cannot know.
	f = newAuthorityFixture(t)
	f.cfg.Fetchers = func() []api.BundleFetcher { return nil }
	f.cfg.Signed = func() (map[string]api.SignedCount, time.Time) { return nil, t0 }
	f.cfg.IsLeader = func() bool { return true }
	rec = change(t, New(f.cfg), `{"action":"activate","id":"02","now":true}`, bearer...)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	res = api.CAAuthorityResult{}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &res))
	require.Len(t, res.Warnings, 2)
	assert.Contains(t, res.Warnings[0], "this replica started at 2026-11-22T12:00:00Z, after root 02 was published")
	assert.Contains(t, res.Warnings[1], "each replica records only the clients it served")
}

func TestAuthorityChangeMessage(t *testing.T) {
	t.Parallel()
	activates := t0.Add(time.Hour)
	for _, tc := range []struct {
		action string
		a      api.CAAuthority
		want   string
	}{
		{"prepare", api.CAAuthority{ID: "02", Kind: api.CAKindRoot, State: "prepared", ActivatesAt: &activates},
			"prepared root 02: peers fetch it with the bundle; it signs from 2026-11-22T13:00:00Z, or at once with `ca authority activate --now`"},
		{"prepare", api.CAAuthority{ID: "0c", Kind: api.CAKindIntermediate, State: "active", Upstream: "corp-vault"},
			"prepared intermediate 0c: signed by upstream corp-vault, it signs every new certificate from now; the one it replaces retired"},
		{"revoke", api.CAAuthority{ID: "k1", Kind: api.CAKindJWT, State: "revoked"},
			"revoked JWT key k1: it left the bundle (sequence 9); peers refuse what it signed once they fetch it"},
	} {
		assert.Equal(t, tc.want, changeMessage(tc.action, tc.a, 9))
	}
}
