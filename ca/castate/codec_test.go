package castate

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDecodeJournalRefusals(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"not json", `{`, "does not parse"},
		{"trailing data", `{"format":1,"trust_domain":"example.org"} {}`, "data after the journal"},
		{"unsafe id", `{"format":1,"trust_domain":"example.org","roots":[{"id":"a/b","state":"active"}]}`, "unsafe"},
		{"duplicate id", `{"format":1,"trust_domain":"example.org","roots":[{"id":"ab","state":"active"},{"id":"ab","state":"retired"}]}`, "duplicate"},
		{"too large", `{"format":1,"trust_domain":"` + strings.Repeat("a", maxJournal) + `"}`, "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeJournal([]byte(tt.doc), "example.org")
			require.ErrorIs(t, err, ErrCorruptState)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func FuzzDecodeJournal(f *testing.F) {
	j := &Journal{TrustDomain: "example.org", Sequence: 3, Roots: []RootRecord{{ID: "ab", State: StateActive, CertSHA256: "00"}, {ID: "cd", State: StateRetired}}}
	data, err := EncodeJournal(j)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte(`{"format":1,"trust_domain":"example.org"}`))
	f.Add([]byte(`{"format":1,"roots":[{"id":"../x","state":"active"}]}`))
	f.Add([]byte(`{"format":2}`))
	f.Add([]byte(`null`))
	j.JWTKeys = []JWTKeyRecord{{KID: "k1", State: StateActive, Algorithm: "ES256"}, {KID: "k2", State: StatePrepared, Algorithm: "RS256"}}
	data, err = EncodeJournal(j)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte(`{"format":1,"jwt_keys":[{"kid":"a","state":"active","algorithm":"HS256"}]}`))
	f.Add([]byte(`{"format":1,"jwt_keys":[{"kid":"a/b","state":"active","algorithm":"ES256"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		j, err := DecodeJournal(data, "")
		if err != nil {
			if !errors.Is(err, ErrCorruptState) {
				t.Fatalf("refusal without ErrCorruptState: %v", err)
			}
			return
		}
		active := 0
		for _, r := range j.Roots {
			if !SafeID(r.ID) {
				t.Fatalf("unsafe id %q accepted", r.ID)
			}
			if r.State == StateActive {
				active++
			}
		}
		if active > 1 {
			t.Fatal("two active roots accepted")
		}
		if err := checkJWTRecords(j.JWTKeys); err != nil {
			t.Fatalf("JWT keys accepted that do not check out: %v", err)
		}
		again, err := EncodeJournal(j)
		if err != nil {
			return // the event trim or size bound
		}
		if _, err := DecodeJournal(again, ""); err != nil {
			t.Fatalf("re-encoded journal refused: %v", err)
		}
	})
}

// A journal of another trust domain is refused as corrupt state is
// (never overwritten), saying which trust domain it holds rather than
// calling it corrupt: the flag that chose the trust domain may be wrong.
func TestDecodeJournalOtherTrustDomain(t *testing.T) {
	data, err := EncodeJournal(&Journal{TrustDomain: "a.example"})
	require.NoError(t, err)
	_, err = DecodeJournal(data, "b.example")
	var other *TrustDomainError
	require.ErrorAs(t, err, &other)
	assert.Equal(t, TrustDomainError{Holds: "a.example", Want: "b.example"}, *other)
	assert.ErrorIs(t, err, ErrCorruptState)
	assert.EqualError(t, err, `it holds the CA of trust domain "a.example", not "b.example"`)
}
