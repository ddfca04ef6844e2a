package federation

import (
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// acceptKeys are the authorities the Accept and Diff tables combine.
type acceptKeys struct {
	ca1, ca2 *x509.Certificate
	jwt1     crypto.PublicKey
	jwt2     crypto.PublicKey
}

func newAcceptKeys(t *testing.T) acceptKeys {
	return acceptKeys{
		ca1:  testca.New(t, "a.org").Cert,
		ca2:  testca.New(t, "a.org").Cert,
		jwt1: testca.NewKey(t, testca.ECP256).Public(),
		jwt2: testca.NewKey(t, testca.ECP256).Public(),
	}
}

// bundleSpec describes a test bundle; seq < 0 means no spiffe_sequence,
// hint 0 means no refresh hint.
type bundleSpec struct {
	td   string
	seq  int64
	hint time.Duration
	x509 []*x509.Certificate
	jwt  map[string]crypto.PublicKey
	wit  map[string]crypto.PublicKey
}

func (s bundleSpec) build(t *testing.T) *spiffebundle.Bundle {
	t.Helper()
	name := s.td
	if name == "" {
		name = "a.org"
	}
	b := spiffebundle.New(td(name))
	b.SetX509Authorities(s.x509)
	b.SetJWTAuthorities(s.jwt)
	for kid, k := range s.wit {
		require.NoError(t, b.AddWITAuthority(kid, k))
	}
	if s.seq >= 0 {
		b.SetSequenceNumber(uint64(s.seq))
	}
	if s.hint > 0 {
		b.SetRefreshHint(s.hint)
	}
	return b
}

func TestAccept(t *testing.T) {
	t.Parallel()
	k := newAcceptKeys(t)
	one := []*x509.Certificate{k.ca1}
	both := []*x509.Certificate{k.ca1, k.ca2}
	swapped := []*x509.Certificate{k.ca2, k.ca1}
	jwt := map[string]crypto.PublicKey{"kid-1": k.jwt1}
	jwtRekeyed := map[string]crypto.PublicKey{"kid-1": k.jwt2}

	tests := []struct {
		name       string
		held       *bundleSpec
		fetched    bundleSpec
		allowEmpty bool
		want       Decision
		wantErr    error
	}{
		{name: "first fetch", fetched: bundleSpec{seq: 1, x509: one}, want: DecisionAccept},
		{name: "first fetch without sequence", fetched: bundleSpec{seq: -1, x509: one}, want: DecisionAccept},
		{name: "first fetch JWT only", fetched: bundleSpec{seq: 1, jwt: jwt}, want: DecisionAccept},
		{name: "first fetch empty", fetched: bundleSpec{seq: 1}, wantErr: ErrEmptyBundle},
		{name: "first fetch empty allowed", fetched: bundleSpec{seq: 1}, allowEmpty: true, want: DecisionAccept},
		{name: "WIT keys alone count as empty", fetched: bundleSpec{seq: 1, wit: jwt}, wantErr: ErrEmptyBundle},

		{name: "other trust domain", held: &bundleSpec{seq: 1, x509: one}, fetched: bundleSpec{td: "b.org", seq: 2, x509: one}, wantErr: ErrTrustDomainMismatch},

		{name: "sequence regression", held: &bundleSpec{seq: 5, x509: one}, fetched: bundleSpec{seq: 4, x509: both}, wantErr: ErrSequenceRegression},
		{name: "sequence regression same content", held: &bundleSpec{seq: 5, x509: one}, fetched: bundleSpec{seq: 4, x509: one}, wantErr: ErrSequenceRegression},
		{name: "same sequence different content", held: &bundleSpec{seq: 5, x509: one}, fetched: bundleSpec{seq: 5, x509: both}, wantErr: ErrSequenceConflict},
		{name: "same sequence JWT key replaced under one kid", held: &bundleSpec{seq: 5, jwt: jwt}, fetched: bundleSpec{seq: 5, jwt: jwtRekeyed}, wantErr: ErrSequenceConflict},
		{name: "same sequence same content", held: &bundleSpec{seq: 5, x509: both, jwt: jwt, hint: time.Minute}, fetched: bundleSpec{seq: 5, x509: both, jwt: jwt, hint: time.Minute}, want: DecisionUnchanged},
		{name: "same sequence reordered", held: &bundleSpec{seq: 5, x509: both}, fetched: bundleSpec{seq: 5, x509: swapped}, want: DecisionUnchanged},
		{name: "same sequence new refresh hint", held: &bundleSpec{seq: 5, x509: one, hint: time.Minute}, fetched: bundleSpec{seq: 5, x509: one, hint: time.Hour}, want: DecisionAccept},
		{name: "higher sequence same content", held: &bundleSpec{seq: 5, x509: one}, fetched: bundleSpec{seq: 6, x509: one}, want: DecisionAccept},
		{name: "rotation", held: &bundleSpec{seq: 5, x509: one}, fetched: bundleSpec{seq: 6, x509: both}, want: DecisionAccept},
		{name: "max sequence", held: &bundleSpec{seq: 5, x509: one}, fetched: bundleSpec{seq: 1<<63 - 1, x509: one}, want: DecisionAccept},

		{name: "no sequences same content", held: &bundleSpec{seq: -1, x509: one}, fetched: bundleSpec{seq: -1, x509: one}, want: DecisionUnchanged},
		{name: "no sequences different content", held: &bundleSpec{seq: -1, x509: one}, fetched: bundleSpec{seq: -1, x509: both}, want: DecisionAccept},
		{name: "publisher starts sequencing", held: &bundleSpec{seq: -1, x509: one}, fetched: bundleSpec{seq: 0, x509: one}, want: DecisionAccept},
		{name: "publisher drops sequence", held: &bundleSpec{seq: 9, x509: one}, fetched: bundleSpec{seq: -1, x509: both}, want: DecisionAccept},

		{name: "revoke everything", held: &bundleSpec{seq: 5, x509: one}, fetched: bundleSpec{seq: 6}, wantErr: ErrEmptyBundle},
		{name: "revoke everything allowed", held: &bundleSpec{seq: 5, x509: one}, fetched: bundleSpec{seq: 6}, allowEmpty: true, want: DecisionAccept},
		{name: "empty regression is a regression", held: &bundleSpec{seq: 5, x509: one}, fetched: bundleSpec{seq: 4}, wantErr: ErrSequenceRegression},
		{name: "held empty unchanged", held: &bundleSpec{seq: 6}, fetched: bundleSpec{seq: 6}, want: DecisionUnchanged},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var held *spiffebundle.Bundle
			if tt.held != nil {
				held = tt.held.build(t)
			}
			got, err := Accept(held, tt.fetched.build(t), tt.allowEmpty)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				assert.Zero(t, got)
				assert.Contains(t, err.Error(), "federation: accept: ")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestAcceptErrorsNameSequences(t *testing.T) {
	t.Parallel()
	k := newAcceptKeys(t)
	held := bundleSpec{seq: 5, x509: []*x509.Certificate{k.ca1}}.build(t)

	_, err := Accept(held, bundleSpec{seq: 3, x509: []*x509.Certificate{k.ca1}}.build(t), false)
	assert.EqualError(t, err, "federation: accept: spiffe_sequence regressed: fetched 3, held 5")

	_, err = Accept(held, bundleSpec{seq: 5, x509: []*x509.Certificate{k.ca2}}.build(t), false)
	assert.EqualError(t, err, "federation: accept: same spiffe_sequence with different authorities: sequence 5, 1 authorities added, 1 removed")

	_, err = Accept(held, nil, false)
	assert.Error(t, err)
}

func TestDecisionString(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "accept", DecisionAccept.String())
	assert.Equal(t, "unchanged", DecisionUnchanged.String())
	assert.Equal(t, "Decision(0)", Decision(0).String())
}

func TestDiff(t *testing.T) {
	t.Parallel()
	k := newAcceptKeys(t)
	fpX := func(c *x509.Certificate) Fingerprint {
		sum := sha256.Sum256(c.Raw)
		return Fingerprint{Kind: AuthorityX509, SHA256: hex.EncodeToString(sum[:])}
	}
	fpK := func(kind AuthorityKind, kid string, pub crypto.PublicKey) Fingerprint {
		der, err := x509.MarshalPKIXPublicKey(pub)
		require.NoError(t, err)
		sum := sha256.Sum256(der)
		return Fingerprint{Kind: kind, KeyID: kid, SHA256: hex.EncodeToString(sum[:])}
	}
	one := bundleSpec{seq: 1, x509: []*x509.Certificate{k.ca1}}
	rotated := bundleSpec{seq: 2, x509: []*x509.Certificate{k.ca2}}

	tests := []struct {
		name           string
		old, new       *bundleSpec
		added, removed []Fingerprint
		wantEmpty      bool
	}{
		{name: "nil to nil", wantEmpty: true},
		{name: "nil to bundle", new: &one, added: []Fingerprint{fpX(k.ca1)}},
		{name: "bundle to nil", old: &one, removed: []Fingerprint{fpX(k.ca1)}},
		{name: "x509 rotation", old: &one, new: &rotated, added: []Fingerprint{fpX(k.ca2)}, removed: []Fingerprint{fpX(k.ca1)}},
		{name: "reorder is no change", old: &bundleSpec{x509: []*x509.Certificate{k.ca1, k.ca2}}, new: &bundleSpec{x509: []*x509.Certificate{k.ca2, k.ca1}}, wantEmpty: true},
		{name: "sequence and hint are not authorities", old: &bundleSpec{seq: 1, x509: []*x509.Certificate{k.ca1}}, new: &bundleSpec{seq: 9, hint: time.Hour, x509: []*x509.Certificate{k.ca1}}, wantEmpty: true},
		{
			name:    "jwt key replaced under the same kid",
			old:     &bundleSpec{jwt: map[string]crypto.PublicKey{"k": k.jwt1}},
			new:     &bundleSpec{jwt: map[string]crypto.PublicKey{"k": k.jwt2}},
			added:   []Fingerprint{fpK(AuthorityJWT, "k", k.jwt2)},
			removed: []Fingerprint{fpK(AuthorityJWT, "k", k.jwt1)},
		},
		{
			name:  "same key under a new kid",
			old:   &bundleSpec{jwt: map[string]crypto.PublicKey{"k1": k.jwt1}},
			new:   &bundleSpec{jwt: map[string]crypto.PublicKey{"k1": k.jwt1, "k2": k.jwt1}},
			added: []Fingerprint{fpK(AuthorityJWT, "k2", k.jwt1)},
		},
		{
			name: "kinds are kept apart",
			old:  &bundleSpec{jwt: map[string]crypto.PublicKey{"k": k.jwt1}},
			new:  &bundleSpec{jwt: map[string]crypto.PublicKey{"k": k.jwt1}, wit: map[string]crypto.PublicKey{"k": k.jwt1}, x509: []*x509.Certificate{k.ca1}},
			added: []Fingerprint{
				fpK(AuthorityWIT, "k", k.jwt1),
				fpX(k.ca1),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var oldB, newB *spiffebundle.Bundle
			if tt.old != nil {
				oldB = tt.old.build(t)
			}
			if tt.new != nil {
				newB = tt.new.build(t)
			}
			d := Diff(oldB, newB)
			assert.Equal(t, tt.wantEmpty, d.Empty())
			assert.Equal(t, tt.added, d.Added)
			assert.Equal(t, tt.removed, d.Removed)
		})
	}
}

func TestFingerprintString(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "x509:ab", Fingerprint{Kind: AuthorityX509, SHA256: "ab"}.String())
	assert.Equal(t, "jwt:kid-1:cd", Fingerprint{Kind: AuthorityJWT, KeyID: "kid-1", SHA256: "cd"}.String())
}
