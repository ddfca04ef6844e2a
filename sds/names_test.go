package sds

import (
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
)

func TestParseName(t *testing.T) {
	tests := []struct {
		name string
		want parsedName
	}{
		{"default", parsedName{kind: kindCert}},
		{"ROOTCA", parsedName{kind: kindTrustDomain, td: localTD}},
		{"ALL", parsedName{kind: kindAll}},
		{"spiffe://local.test", parsedName{kind: kindTrustDomain, td: localTD}},
		{"spiffe://remote.test", parsedName{kind: kindTrustDomain, td: remoteTD}},
		{"spiffe://local.test/ns/a/sa/a", parsedName{kind: kindCert, id: idA}},
		{"spiffe://remote.test/w", parsedName{kind: kindCert, id: spiffeid.RequireFromPath(remoteTD, "/w")}},
		{"spiffe://local.test/", parsedName{}},     // trailing slash: not canonical
		{"spiffe://Local.test", parsedName{}},      // upper case trust domain
		{"spiffe://local.test/a//b", parsedName{}}, // empty segment
		{"spiffe://", parsedName{}},
		{"SPIFFE://local.test", parsedName{}},
		{"https://local.test", parsedName{}},
		{"Default", parsedName{}},
		{"rootca", parsedName{}},
		{"", parsedName{}},
		{"*", parsedName{}},
		{"spiffe://local.test/" + strings.Repeat("a", MaxNameLen), parsedName{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, parseName(tt.name, localTD))
		})
	}
	t.Run("no local trust domain", func(t *testing.T) {
		assert.Equal(t, parsedName{}, parseName("ROOTCA", spiffeid.TrustDomain{}))
	})
}

func FuzzParseName(f *testing.F) {
	for _, s := range []string{"default", "ROOTCA", "ALL", "spiffe://local.test", "spiffe://remote.test",
		"spiffe://local.test/ns/a/sa/a", "spiffe://local.test/", "spiffe://x/../y", "spiffe://%41", "", "*",
		"spiffe://a.b:8080/x", "spiffe://user@host/x", "spiffe://local.test/a?b#c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		p := parseName(name, localTD)
		switch p.kind {
		case kindUnknown:
			if p != (parsedName{}) {
				t.Fatalf("unknown name %q with fields %+v", name, p)
			}
		case kindCert:
			if name != DefaultName {
				// The certificate named is exactly the ID spelled.
				if p.id.IsZero() || p.id.String() != name || p.id.Path() == "" {
					t.Fatalf("cert name %q parsed as %q", name, p.id)
				}
			}
		case kindTrustDomain:
			if name != RootCAName && p.td.IDString() != name {
				t.Fatalf("trust domain name %q parsed as %q", name, p.td.IDString())
			}
		case kindAll:
			if name != AllName {
				t.Fatalf("%q parsed as ALL", name)
			}
		}
		if len(name) > MaxNameLen && p.kind != kindUnknown {
			t.Fatalf("name of %d bytes accepted", len(name))
		}
	})
}

func TestCheckNames(t *testing.T) {
	many := make([]string, MaxNames+1)
	for i := range many {
		many[i] = "n"
	}
	tests := []struct {
		name    string
		names   []string
		wantErr string
	}{
		{"none", nil, ""},
		{"max", many[:MaxNames], ""},
		{"too many", many, "65 resource names requested; at most 64"},
		{"longest", []string{strings.Repeat("a", MaxNameLen)}, ""},
		{"too long", []string{"ok", strings.Repeat("a", MaxNameLen+1)}, "resource name 1 is 2049 bytes long"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkNames(tt.names)
			if tt.wantErr == "" {
				assert.NoError(t, err)
			} else {
				assert.ErrorContains(t, err, tt.wantErr)
			}
		})
	}
}
