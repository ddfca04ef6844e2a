package ca

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	josejwt "github.com/go-jose/go-jose/v4/jwt"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	spiffejwt "github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

var jwtWorkload = spiffeid.RequireFromPath(tdExample, "/jwt-workload")

// jwtConfig has short JWT lifetimes: a key lives 4h, so its successor is
// prepared at 2h; JWT-SVIDs live at most 30m.
func jwtConfig(t *testing.T, clk *clocktesting.FakeClock) Config {
	cfg := testConfig(t, clk)
	cfg.JWTKeyTTL = 4 * time.Hour
	cfg.JWTSVIDTTL = 5 * time.Minute
	cfg.MaxJWTSVIDTTL = 30 * time.Minute
	return cfg
}

func jwtStates(a *Authority) string {
	var out []string
	for _, k := range a.JWTKeys() {
		out = append(out, string(k.State))
	}
	return strings.Join(out, ",")
}

func activeKID(t *testing.T, a *Authority) string {
	t.Helper()
	for _, k := range a.JWTKeys() {
		if k.State == castate.StateActive {
			return k.KID
		}
	}
	t.Fatal("no active JWT key")
	return ""
}

// signedKID mints a token and returns the kid in its header.
func signedKID(t *testing.T, a *Authority) string {
	t.Helper()
	token, _, err := a.SignJWT(jwtWorkload, []string{"aud"}, 0)
	require.NoError(t, err)
	jws, err := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{jose.ES256, jose.ES384, jose.RS256})
	require.NoError(t, err)
	return jws.Signatures[0].Header.KeyID
}

// TestJWTKeyLifecycle walks one JWT key rotation on a fake clock: the
// bundle gains the successor at half life, it signs only PublishLead
// hints later, and the old key leaves the bundle only once the longest
// JWT-SVID it could have signed has expired.
func TestJWTKeyLifecycle(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	a, err := New(jwtConfig(t, clk))
	require.NoError(t, err)
	first := activeKID(t, a)
	lead := PublishLead * time.Minute
	// Removal: retired at activation, plus the retire margin and the
	// maximum JWT-SVID TTL.
	activation := t0.Add(2*time.Hour + lead)
	removal := activation.Add(retireMargin + 30*time.Minute)
	steps := []struct {
		name    string
		at      time.Time
		states  string
		kids    int // JWT authorities in the bundle
		signer  string
		seqMove bool
	}{
		{"bootstrap signs at once", t0, "active", 1, "first", false},
		{"before half life", t0.Add(2*time.Hour - time.Second), "active", 1, "first", false},
		{"successor published at half life", t0.Add(2 * time.Hour), "active,prepared", 2, "first", true},
		{"no activation before the lead", activation.Add(-time.Second), "active,prepared", 2, "first", false},
		{"activation after PublishLead hints", activation, "retired,active", 2, "second", false},
		{"retired key kept for the longest JWT-SVID", removal.Add(-time.Second), "retired,active", 2, "second", false},
		{"removed after it", removal, "active", 1, "second", true},
	}
	var second string
	seq := a.Sequence()
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			clk.SetTime(st.at)
			require.NoError(t, a.Reconcile())
			assert.Equal(t, st.states, jwtStates(a))
			assert.Len(t, a.Bundle().JWTAuthorities(), st.kids)
			if keys := a.JWTKeys(); second == "" && len(keys) == 2 {
				second = keys[1].KID
			}
			want := map[string]string{"first": first, "second": second}[st.signer]
			assert.Equal(t, want, signedKID(t, a), "signed by the %s key", st.signer)
			if st.seqMove {
				assert.Greater(t, a.Sequence(), seq, "a change to the published keys moves the sequence")
			} else {
				assert.Equal(t, seq, a.Sequence(), "nothing published changed")
			}
			seq = a.Sequence()
		})
	}
	require.NotEqual(t, first, second)
	j, _, err := NewStore(a.cfg.DataDir).Load("")
	require.NoError(t, err)
	var events []string
	for _, e := range j.Events {
		if e.KID != "" {
			events = append(events, e.Event)
		}
	}
	assert.Equal(t, []string{"JWT key bootstrap", "JWT key prepared (scheduled)", "JWT key retired", "JWT key activated", "JWT key removed"}, events)
	assert.Equal(t, int64(1800), j.MaxJWTSVIDTTLSeconds)
}

// A retired key stays published for the largest maximum JWT-SVID TTL ever
// recorded, not the one configured now.
func TestJWTKeyRemovalUsesLargestRecordedMaxTTL(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := jwtConfig(t, clk)
	cfg.MaxJWTSVIDTTL = time.Hour
	_, err := New(cfg)
	require.NoError(t, err)
	cfg.MaxJWTSVIDTTL = 30 * time.Minute
	cfg.Registerer = prometheus.NewRegistry()
	a, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, a.manager.rotateJWTKey())
	clk.Step(PublishLead * time.Minute)
	require.NoError(t, a.Reconcile())
	retired := a.JWTKeys()[0]
	require.Equal(t, castate.StateRetired, retired.State)
	assert.Equal(t, clk.Now().Add(retireMargin+time.Hour), retired.RemoveAfter)
}

// Lowering the refresh hint after a key was prepared does not shorten the
// lead it was prepared with.
func TestJWTKeyLeadKeptWhenHintLowered(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := jwtConfig(t, clk)
	a, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, a.manager.rotateJWTKey())
	require.NoError(t, a.manager.rotateJWTKey(), "a second request while one waits does nothing")
	require.Equal(t, "active,prepared", jwtStates(a))

	clk.Step(time.Minute)
	cfg.RefreshHint = time.Second
	cfg.Registerer = prometheus.NewRegistry()
	b, err := New(cfg)
	require.NoError(t, err)
	clk.SetTime(t0.Add(PublishLead*time.Minute - time.Second))
	require.NoError(t, b.Reconcile())
	assert.Equal(t, "active,prepared", jwtStates(b), "5 of the old hints, not of the new one")
	clk.SetTime(t0.Add(PublishLead * time.Minute))
	require.NoError(t, b.Reconcile())
	assert.Equal(t, "retired,active", jwtStates(b))
}

func TestJWTKeysSurviveRestart(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := jwtConfig(t, clk)
	a, err := New(cfg)
	require.NoError(t, err)
	kid := activeKID(t, a)
	info, err := os.Stat(a.manager.store.jwtKeyPath(kid))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "JWT keys are 0600 like root keys")

	clk.Step(time.Minute)
	cfg.Registerer = prometheus.NewRegistry()
	b, err := New(cfg)
	require.NoError(t, err)
	assert.Equal(t, kid, activeKID(t, b))
	assert.Equal(t, kid, signedKID(t, b))
}

// State written before JWT keys existed loads and the roots are kept.
// Peers already poll its bundle, so the first JWT key is published
// PublishLead refresh hints before it signs, like every successor; until
// then SignJWT says when it will sign.
func TestOldStateWithoutJWTKeysLoads(t *testing.T) {
	s, j, rootID := storeWithRoot(t)
	data, err := os.ReadFile(s.journalPath())
	require.NoError(t, err)
	require.NotContains(t, string(data), "jwt")
	start := t0.Add(time.Hour)
	clk := clocktesting.NewFakeClock(start)
	cfg := jwtConfig(t, clk)
	cfg.DataDir = filepath.Dir(s.Dir())
	a, err := New(cfg)
	require.NoError(t, err)
	require.Len(t, a.Roots(), 1)
	assert.Equal(t, rootID, a.Roots()[0].ID)
	assert.Equal(t, "prepared", jwtStates(a))
	assert.Len(t, a.Bundle().JWTAuthorities(), 1, "published at once")
	assert.Greater(t, a.Sequence(), j.Sequence)
	assert.Equal(t, uint64(start.Unix()), a.Sequence(), "one new sequence for the start and the new key")
	require.NoError(t, a.Ready(), "JWT keys do not gate readiness")

	lead := PublishLead * cfg.RefreshHint
	_, _, err = a.SignJWT(jwtWorkload, []string{"aud"}, 0)
	require.ErrorIs(t, err, ErrInvalidSigningMaterial)
	assert.ErrorContains(t, err, "signs from "+start.Add(lead).UTC().Format(time.RFC3339))
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.jwtSignings.WithLabelValues("signing_material")))
	a.manager.mu.RLock()
	assert.Equal(t, start.Add(lead), a.manager.nextJWTStepLocked(start), "the plan activates it then")
	a.manager.mu.RUnlock()

	clk.Step(lead - time.Second)
	require.NoError(t, a.Reconcile())
	assert.Equal(t, "prepared", jwtStates(a), "not before the lead")
	clk.Step(time.Second)
	require.NoError(t, a.Reconcile())
	assert.Equal(t, "active", jwtStates(a))
	assert.Equal(t, a.JWTKeys()[0].KID, signedKID(t, a))
}

// Where no peer can hold the bundle yet (a fresh CA, self-signed or
// plug-in) the first JWT key signs at once; a plug-in CA whose state
// already publishes roots gets a prepared one.
func TestFirstJWTKeyState(t *testing.T) {
	t.Run("fresh self-signed", func(t *testing.T) {
		a, err := New(jwtConfig(t, clocktesting.NewFakeClock(t0)))
		require.NoError(t, err)
		assert.Equal(t, "active", jwtStates(a))
		signedKID(t, a)
	})
	t.Run("fresh plug-in", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(time.Now())
		a := newPluginAuthority(t, clk, Config{Backend: newMemBackend()})
		assert.Equal(t, "active", jwtStates(a))
		signedKID(t, a)
	})
	t.Run("plug-in state from before JWT keys", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(time.Now())
		mem := newMemBackend()
		newPluginAuthority(t, clk, Config{Backend: mem})
		j, _, _, v, err := mem.Load(tdExample.Name())
		require.NoError(t, err)
		require.NotEmpty(t, j.PluginRoots)
		j.JWTKeys = nil
		_, err = mem.Commit(v, j, nil, nil)
		require.NoError(t, err)

		clk.Step(time.Minute)
		a := newPluginAuthority(t, clk, Config{Backend: mem})
		assert.Equal(t, "prepared", jwtStates(a))
		_, _, err = a.SignJWT(jwtWorkload, []string{"aud"}, 0)
		require.ErrorIs(t, err, ErrInvalidSigningMaterial)
		assert.ErrorContains(t, err, "published ahead of use")
		clk.Step(PublishLead * time.Minute)
		require.NoError(t, a.manager.syncPlugin())
		assert.Equal(t, "active", jwtStates(a))
		signedKID(t, a)
	})
}

func TestCorruptJWTKeyRefused(t *testing.T) {
	tests := []struct {
		name      string
		break_    func(t *testing.T, path string)
		want      string
		isCorrupt bool
	}{
		{"missing", func(t *testing.T, p string) { require.NoError(t, os.Remove(p)) }, "no such file", true},
		{"not a key", func(t *testing.T, p string) { require.NoError(t, os.WriteFile(p, []byte("junk"), 0o600)) }, "private key", true},
		{"another key", func(t *testing.T, p string) {
			other, err := newJWTKey(JWTKeyES256, t0, time.Hour)
			require.NoError(t, err)
			pem, err := castate.EncodeJWTKey(other)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(p, pem, 0o600))
		}, "does not match the kid", true},
		{"another algorithm", func(t *testing.T, p string) {
			other, err := newJWTKey(JWTKeyES384, t0, time.Hour)
			require.NoError(t, err)
			pem, err := castate.EncodeJWTKey(other)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(p, pem, 0o600))
		}, "key is for ES384", true},
		{"readable by others", func(t *testing.T, p string) { require.NoError(t, os.Chmod(p, 0o644)) }, "chmod 600", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			cfg := jwtConfig(t, clk)
			running, err := New(cfg)
			require.NoError(t, err)
			bundle := running.Bundle()
			tt.break_(t, running.manager.store.jwtKeyPath(activeKID(t, running)))

			cfg.Registerer = prometheus.NewRegistry()
			_, err = New(cfg)
			require.Error(t, err)
			assert.ErrorContains(t, err, tt.want)
			if tt.isCorrupt {
				assert.ErrorIs(t, err, castate.ErrCorruptState)
			}

			// A running CA keeps what it serves and signs with, and says
			// why. The journal changed on disk, so it reloads.
			clk.Step(time.Second)
			j, err := os.ReadFile(running.manager.store.journalPath())
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(running.manager.store.journalPath(), append(j, ' '), 0o600))
			require.Error(t, running.Reconcile())
			assert.True(t, bundle.Equal(running.Bundle()), "last good bundle kept")
			signedKID(t, running)
		})
	}
}

func TestFollowerSignsWithLeadersJWTKey(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	mem := newMemBackend()
	leader, err := New(backendConfig(clk, mem, leaderFlag(true)))
	require.NoError(t, err)
	follower, err := New(backendConfig(clk, mem, leaderFlag(false)))
	require.NoError(t, err)
	kid := activeKID(t, leader)
	assert.Equal(t, kid, signedKID(t, follower))
	assert.ErrorIs(t, follower.manager.rotateJWTKey(), castate.ErrNotLeader)

	require.NoError(t, leader.manager.rotateJWTKey())
	require.NoError(t, follower.Reload())
	assert.True(t, leader.Bundle().Equal(follower.Bundle()), "the follower publishes the successor too")
	assert.Len(t, follower.Bundle().JWTAuthorities(), 2)
	assert.Equal(t, kid, signedKID(t, follower), "the successor waits out its lead")

	// A follower of a leader that has not written JWT keys yet (an older
	// version) serves X.509 and says why it cannot mint.
	mem2 := newMemBackend()
	old := backendConfig(clk, mem2, leaderFlag(true))
	_, err = New(old)
	require.NoError(t, err)
	j, roots, _, v, err := mem2.Load("")
	require.NoError(t, err)
	j.JWTKeys = nil
	_, err = mem2.Commit(v, j, roots, nil)
	require.NoError(t, err)
	f2, err := New(backendConfig(clk, mem2, leaderFlag(false)))
	require.NoError(t, err)
	require.NoError(t, f2.Ready(), "X.509 is fine; JWT keys do not gate readiness")
	_, _, err = f2.SignJWT(jwtWorkload, []string{"aud"}, 0)
	assert.ErrorIs(t, err, ErrInvalidSigningMaterial)
	assert.ErrorContains(t, err, "no active JWT key")
	assert.Equal(t, 1.0, testutil.ToFloat64(f2.metrics.jwtSignings.WithLabelValues("signing_material")))
	assert.Zero(t, testutil.ToFloat64(f2.metrics.jwtKeys.WithLabelValues("active")))
}

// SignJWT's tokens validate with go-spiffe against a JWT bundle built from
// the published bundle; lifetimes follow the config.
func TestSignJWT(t *testing.T) {
	// Real time: go-spiffe checks exp against it.
	now := time.Now().Truncate(time.Second)
	for _, kt := range []JWTKeyType{JWTKeyES256, JWTKeyES384, JWTKeyRS256} {
		t.Run(string(kt), func(t *testing.T) {
			clk := clocktesting.NewFakeClock(now)
			cfg := jwtConfig(t, clk)
			cfg.JWTKeyType = kt
			a, err := New(cfg)
			require.NoError(t, err)
			token, exp, err := a.SignJWT(jwtWorkload, []string{"db", "cache"}, 0)
			require.NoError(t, err)
			assert.Equal(t, now.Add(5*time.Minute), exp, "default TTL")
			jb := jwtbundle.FromJWTAuthorities(tdExample, a.Bundle().JWTAuthorities())
			svid, err := spiffejwt.ParseAndValidate(token, jb, []string{"cache"})
			require.NoError(t, err)
			assert.Equal(t, jwtWorkload, svid.ID)
			assert.True(t, exp.Equal(svid.Expiry), "the returned expiry is the token's")
			assert.Equal(t, string(kt), a.JWTKeys()[0].Algorithm)
		})
	}

	clk := clocktesting.NewFakeClock(now)
	a, err := New(jwtConfig(t, clk))
	require.NoError(t, err)
	ttls := []struct {
		name string
		ttl  time.Duration
		want time.Duration
		err  error
	}{
		{"default", 0, 5 * time.Minute, nil},
		{"asked", 10 * time.Minute, 10 * time.Minute, nil},
		{"clamped to the maximum", 24 * time.Hour, 30 * time.Minute, nil},
		{"negative", -time.Second, 0, ErrInvalidTTL},
	}
	for _, tt := range ttls {
		t.Run(tt.name, func(t *testing.T) {
			_, exp, err := a.SignJWT(jwtWorkload, []string{"aud"}, tt.ttl)
			if tt.err != nil {
				require.ErrorIs(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, now.Add(tt.want), exp)
		})
	}
	t.Run("never outlives its key", func(t *testing.T) {
		clk.SetTime(a.JWTKeys()[0].NotAfter.Add(-time.Minute))
		_, exp, err := a.SignJWT(jwtWorkload, []string{"aud"}, 0)
		require.NoError(t, err)
		assert.Equal(t, a.JWTKeys()[0].NotAfter, exp)
		clk.SetTime(now)
	})
	refusals := []struct {
		name     string
		id       spiffeid.ID
		audience []string
		err      error
		result   string
	}{
		{"no audience", jwtWorkload, nil, jwtsvid.ErrInvalidClaims, "invalid_claims"},
		{"empty audience", jwtWorkload, []string{""}, jwtsvid.ErrInvalidClaims, "invalid_claims"},
		{"another trust domain", spiffeid.RequireFromString("spiffe://other.org/w"), []string{"aud"}, ErrIdentityNotAllowed, "identity_not_allowed"},
		{"no identity", spiffeid.ID{}, []string{"aud"}, ErrIdentityNotAllowed, "identity_not_allowed"},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			before := testutil.ToFloat64(a.metrics.jwtSignings.WithLabelValues(tt.result))
			_, _, err := a.SignJWT(tt.id, tt.audience, 0)
			require.ErrorIs(t, err, tt.err)
			assert.Equal(t, before+1, testutil.ToFloat64(a.metrics.jwtSignings.WithLabelValues(tt.result)))
		})
	}
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.jwtKeys.WithLabelValues("active")))
	assert.Positive(t, testutil.ToFloat64(a.metrics.jwtSignings.WithLabelValues("ok")))
}

// The published document carries the JWT key with its kid and use.
func TestBundleDocumentCarriesJWTKeys(t *testing.T) {
	a, err := New(jwtConfig(t, clocktesting.NewFakeClock(t0)))
	require.NoError(t, err)
	doc, err := bundledoc.Marshal(a.Bundle())
	require.NoError(t, err)
	var parsed struct {
		Keys []struct {
			Use string `json:"use"`
			Kid string `json:"kid"`
			Kty string `json:"kty"`
		} `json:"keys"`
	}
	require.NoError(t, json.Unmarshal(doc, &parsed))
	var jwtKeys []string
	for _, k := range parsed.Keys {
		if k.Use == "jwt-svid" {
			jwtKeys = append(jwtKeys, k.Kid+"/"+k.Kty)
		}
	}
	assert.Equal(t, []string{activeKID(t, a) + "/EC"}, jwtKeys)
}

func TestJWTConfigValidation(t *testing.T) {
	tests := []struct {
		name string
		edit func(c *Config)
		want string
	}{
		{"unknown type", func(c *Config) { c.JWTKeyType = "HS256" }, `unknown JWT key type "HS256" (valid: ES256, ES384, RS256)`},
		{"negative", func(c *Config) { c.JWTSVIDTTL = -time.Second }, "must not be negative"},
		{"default over max", func(c *Config) { c.JWTSVIDTTL = time.Hour }, "JWT-SVID TTL 1h0m0s exceeds the maximum 30m0s"},
		{"key TTL too short", func(c *Config) { c.JWTKeyTTL = time.Hour }, "JWT key TTL 1h0m0s is too short"},
		{"default under a second", func(c *Config) { c.JWTSVIDTTL = 500 * time.Millisecond }, "JWT-SVID TTL 500ms is under one second"},
		{"maximum under a second", func(c *Config) { c.JWTSVIDTTL, c.MaxJWTSVIDTTL = 0, 500*time.Millisecond }, "maximum JWT-SVID TTL 500ms is under one second"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := jwtConfig(t, clocktesting.NewFakeClock(t0))
			tt.edit(&cfg)
			_, err := New(cfg)
			assert.ErrorContains(t, err, tt.want)
		})
	}
	cfg := testConfig(t, clocktesting.NewFakeClock(t0))
	cfg.MaxJWTSVIDTTL = time.Minute
	a, err := New(cfg)
	require.NoError(t, err)
	assert.Equal(t, time.Minute, a.cfg.JWTSVIDTTL, "the default is lowered to the maximum")
	assert.Equal(t, defaultJWTKeyTTL, a.cfg.JWTKeyTTL)
	assert.Equal(t, JWTKeyES256, a.cfg.JWTKeyType)
}

// In plug-in mode the X.509 material comes from the directory, and the JWT
// keys are still the CA's own: kept in the journal, rotated here.
func TestPluginModeKeepsItsOwnJWTKeys(t *testing.T) {
	now := time.Now()
	clk := clocktesting.NewFakeClock(now)
	pluginDir, dataDir := t.TempDir(), t.TempDir()
	pki := newPluginPKI(t, pluginPKIOptions{now: now, midType: testca.ECP256})
	writePluginDir(t, pluginDir, pki.files(t, true))
	a, err := pluginAuthority(t, clk, pluginDir, dataDir)
	require.NoError(t, err)
	require.NoError(t, a.Ready())
	kid := activeKID(t, a)
	assert.Equal(t, kid, signedKID(t, a))
	assert.Len(t, a.Bundle().JWTAuthorities(), 1)
	seq := a.Sequence()

	require.NoError(t, a.manager.rotateJWTKey())
	assert.Equal(t, "active,prepared", jwtStates(a))
	assert.Greater(t, a.Sequence(), seq)
	assert.Len(t, a.Bundle().JWTAuthorities(), 2)

	clk.Step(time.Second)
	b, err := pluginAuthority(t, clk, pluginDir, dataDir)
	require.NoError(t, err)
	assert.Equal(t, kid, activeKID(t, b), "a restart keeps the JWT keys")
	assert.Equal(t, "active,prepared", jwtStates(b))
	clk.Step(PublishLead * time.Minute)
	require.NoError(t, b.manager.syncPlugin())
	assert.Equal(t, "retired,active", jwtStates(b), "activated after the lead, counted from the restart")
	assert.NotEqual(t, kid, signedKID(t, b))
}

// FuzzDecodeJWTKey feeds arbitrary key files to the JWT key loader.
// Properties: nothing panics, every refusal is ErrCorruptState and never
// quotes the file, and an accepted key is the one the record names.
func FuzzDecodeJWTKey(f *testing.F) {
	var recs []castate.JWTKeyRecord
	for _, kt := range []JWTKeyType{JWTKeyES256, JWTKeyES384} {
		k, err := newJWTKey(kt, t0, time.Hour)
		if err != nil {
			f.Fatal(err)
		}
		pem, err := castate.EncodeJWTKey(k)
		if err != nil {
			f.Fatal(err)
		}
		recs = append(recs, k.JWTKeyRecord)
		f.Add(pem, uint8(len(recs)-1))
		f.Add(pem[:len(pem)/2], uint8(0))
		f.Add(append(pem, pem...), uint8(0))
	}
	f.Add([]byte("not a key"), uint8(0))
	rsaPEM, err := castate.EncodeJWTKey(&castate.JWTKey{Key: testca.NewKey(f, testca.RSA2048)})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(rsaPEM, uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, which uint8) {
		rec := recs[int(which)%len(recs)]
		k, err := castate.DecodeJWTKey(rec, data)
		if err != nil {
			if !errors.Is(err, castate.ErrCorruptState) {
				t.Fatalf("refusal without ErrCorruptState: %v", err)
			}
			if len(data) > 40 && strings.Contains(err.Error(), string(data[20:40])) {
				t.Fatal("error quotes the key file")
			}
			return
		}
		kid, err := jwtKID(k.Key.Public())
		if err != nil || kid != rec.KID {
			t.Fatalf("accepted a key whose kid is %q, not %q", kid, rec.KID)
		}
	})
}

// `ca rotate --jwt` beside a running server: the server publishes the key
// at its next check and counts the lead from then.
func TestRequestJWTRotation(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := jwtConfig(t, clk)
	a, err := New(cfg)
	require.NoError(t, err)
	kid, created, err := RequestJWTRotation(cfg.DataDir, t0)
	require.NoError(t, err)
	require.True(t, created)
	again, created, err := RequestJWTRotation(cfg.DataDir, t0)
	require.NoError(t, err)
	assert.False(t, created, "one waits already")
	assert.Equal(t, kid, again)

	clk.Step(time.Minute)
	require.NoError(t, a.Reconcile())
	require.Equal(t, "active,prepared", jwtStates(a))
	assert.Equal(t, t0.Add(time.Minute), a.JWTKeys()[1].PublishedAt, "published when the server picked it up")
	clk.Step(PublishLead*time.Minute - time.Second)
	require.NoError(t, a.Reconcile())
	assert.Equal(t, "active,prepared", jwtStates(a))
	clk.Step(time.Second)
	require.NoError(t, a.Reconcile())
	assert.Equal(t, "retired,active", jwtStates(a))
	assert.Equal(t, kid, signedKID(t, a))

	_, _, err = RequestJWTRotation(t.TempDir(), t0)
	assert.ErrorContains(t, err, "no CA state")
}

// A replica configured with a higher maximum JWT-SVID TTL than the leader
// mints no token longer than the journal's recorded maximum: the leader
// removes a retired key once that has passed.
func TestFollowerClampsJWTSVIDTTLToRecordedMax(t *testing.T) {
	now := time.Now().Truncate(time.Second)
	clk := clocktesting.NewFakeClock(now)
	mem := newMemBackend()
	lcfg := backendConfig(clk, mem, leaderFlag(true))
	lcfg.MaxJWTSVIDTTL = 10 * time.Minute
	_, err := New(lcfg)
	require.NoError(t, err)
	fcfg := backendConfig(clk, mem, leaderFlag(false))
	fcfg.MaxJWTSVIDTTL = 2 * time.Hour
	follower, err := New(fcfg)
	require.NoError(t, err)
	_, exp, err := follower.SignJWT(jwtWorkload, []string{"aud"}, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, now.Add(10*time.Minute), exp, "clamped to the leader's recorded maximum")
	_, exp, err = follower.SignJWT(jwtWorkload, []string{"aud"}, 0)
	require.NoError(t, err)
	assert.Equal(t, now.Add(5*time.Minute), exp, "the default is below both maxima")
}

// JWT times are whole seconds: a TTL under a second is refused, and a key
// whose NotAfter is within the second cannot sign (signing material, not
// invalid claims). The clock sits off whole seconds, where exp used to land
// at or before iat.
func TestSignJWTSubSecond(t *testing.T) {
	start := t0.Add(300 * time.Millisecond)
	clk := clocktesting.NewFakeClock(start)
	a, err := New(jwtConfig(t, clk))
	require.NoError(t, err)
	notAfter := a.JWTKeys()[0].NotAfter
	tests := []struct {
		name   string
		at     time.Time
		ttl    time.Duration
		err    error
		result string
		exp    time.Time
	}{
		{"100ms", t0.Add(800 * time.Millisecond), 100 * time.Millisecond, ErrInvalidTTL, "invalid_ttl", time.Time{}},
		{"900ms", start, 900 * time.Millisecond, ErrInvalidTTL, "invalid_ttl", time.Time{}},
		{"1s off a whole second", t0.Add(800 * time.Millisecond), time.Second, nil, "ok", t0.Add(time.Second)},
		{"1.5s", t0.Add(800 * time.Millisecond), 1500 * time.Millisecond, nil, "ok", t0.Add(time.Second)},
		{"key expires within the second", notAfter.Add(-200 * time.Millisecond), 0, ErrInvalidSigningMaterial, "signing_material", time.Time{}},
		{"key expires in a second and a bit", notAfter.Add(-1200 * time.Millisecond), 0, nil, "ok", notAfter.Truncate(time.Second)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk.SetTime(tt.at)
			before := testutil.ToFloat64(a.metrics.jwtSignings.WithLabelValues(tt.result))
			token, exp, err := a.SignJWT(jwtWorkload, []string{"aud"}, tt.ttl)
			assert.Equal(t, before+1, testutil.ToFloat64(a.metrics.jwtSignings.WithLabelValues(tt.result)))
			if tt.err != nil {
				require.ErrorIs(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.exp, exp)
			jws, err := josejwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.ES256})
			require.NoError(t, err)
			var c josejwt.Claims
			require.NoError(t, jws.UnsafeClaimsWithoutVerification(&c))
			assert.True(t, tt.at.Truncate(time.Second).Equal(c.IssuedAt.Time()), "iat is the whole second")
			assert.True(t, c.Expiry.Time().After(c.IssuedAt.Time()))
			assert.True(t, exp.Equal(c.Expiry.Time()), "the returned expiry is the token's")
		})
	}
}

// With JWTIssuer every token carries it as iss; without, none does; a
// malformed issuer is refused at New, before anything is signed.
func TestSignJWTIssuer(t *testing.T) {
	now := time.Now().Truncate(time.Second)
	iss := func(cfg Config) (any, bool) {
		a, err := New(cfg)
		require.NoError(t, err)
		token, _, err := a.SignJWT(jwtWorkload, []string{"sts.amazonaws.com"}, 0)
		require.NoError(t, err)
		jb := jwtbundle.FromJWTAuthorities(tdExample, a.Bundle().JWTAuthorities())
		svid, err := spiffejwt.ParseAndValidate(token, jb, []string{"sts.amazonaws.com"})
		require.NoError(t, err)
		v, ok := svid.Claims["iss"]
		return v, ok
	}
	cfg := jwtConfig(t, clocktesting.NewFakeClock(now))
	_, ok := iss(cfg)
	assert.False(t, ok, "no issuer configured, no iss")

	cfg = jwtConfig(t, clocktesting.NewFakeClock(now))
	cfg.JWTIssuer = "https://oidc.example.org/prod"
	got, ok := iss(cfg)
	assert.True(t, ok)
	assert.Equal(t, "https://oidc.example.org/prod", got)

	cfg = jwtConfig(t, clocktesting.NewFakeClock(now))
	cfg.JWTIssuer = "http://oidc.example.org"
	_, err := New(cfg)
	assert.ErrorContains(t, err, "JWT issuer: issuer \"http://oidc.example.org\": scheme must be https")
}
