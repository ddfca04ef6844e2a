package api

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/trustbridge/trustbridge/federation"
)

// SourceLabel says where a held bundle comes from, never calling a
// bundle set at run time a file or a bootstrap bundle fetched.
func TestSourceLabel(t *testing.T) {
	tests := []struct {
		origin, held, want string
	}{
		{OriginStatic, "", "set at run time by bundle set"},
		{OriginBundleFile + ":/etc/b.json", "", "bundle file /etc/b.json"},
		{"flag", federation.HeldFetched, "fetched (--federate)"},
		{"file", federation.HeldBootstrap, "bootstrap bundle, not yet fetched (--federation-config)"},
		{"runtime", "", "nothing fetched yet (federation add)"},
		{"crd:west", federation.HeldFetched, "fetched (resource west)"},
		{"", federation.HeldFetched, "fetched"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, SourceLabel(tt.origin, tt.held), "%q %q", tt.origin, tt.held)
	}
}
