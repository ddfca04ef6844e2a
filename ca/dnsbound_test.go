package ca

import (
	"testing"

	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
)

// TestWorkloadDNSNamesBoundFitsIdentityMap ties the leaf's bound to the
// identity map's: a workload's leaf carries every name its identity map
// entry gives it (at most identitymap.MaxIdentityDNSNames) and the one of
// --workload-dns-name-template. Raise maxWorkloadDNSNames with the map's
// bound, or a workload whose rules are valid would be refused its
// certificate.
func TestWorkloadDNSNamesBoundFitsIdentityMap(t *testing.T) {
	const templateNames = 1
	if want := identitymap.MaxIdentityDNSNames + templateNames; maxWorkloadDNSNames < want {
		t.Errorf("maxWorkloadDNSNames = %d, want at least %d (identitymap.MaxIdentityDNSNames %d + the template's %d)",
			maxWorkloadDNSNames, want, identitymap.MaxIdentityDNSNames, templateNames)
	}
}
