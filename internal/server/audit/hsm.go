package audit

import (
	"fmt"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// CodeKeyOutsideHSM: the server runs with --require-hsm, yet one of its
// own prepared or active roots or JWT keys has its private key in the CA
// state rather than in the key manager.
const CodeKeyOutsideHSM = "key_outside_hsm"

// hsmFindings judges where the local CA keeps the keys it signs with now
// or next, when the snapshot says they must be in a key manager. Retired
// keys sign nothing more and leave on their own.
func hsmFindings(s api.Snapshot, td api.TrustDomain) []api.Finding {
	if !s.RequireHSM || !td.Local {
		return nil
	}
	var out []api.Finding
	for _, a := range td.Authorities {
		if a.KeyStorage != "state" || (a.State != "active" && a.State != "prepared") {
			continue
		}
		name := "root " + a.SHA256
		switch {
		case a.Kind == api.KindJWT:
			name = "JWT key " + a.KeyID
		case a.Upstream != "":
			name = "intermediate " + a.SHA256
		}
		out = append(out, api.Finding{
			Severity: api.SeverityCritical, Code: CodeKeyOutsideHSM, TrustDomain: td.Name, Authority: a.SHA256,
			Message: fmt.Sprintf("%s %s of %s keeps its private key in the CA state, but the server runs with --require-hsm", a.State, name, td.Name),
			Fix:     "start the server with its key manager (--key-manager pkcs11 --pkcs11-module LIB --pkcs11-token-label LABEL): every successor's key is then made in the HSM, and the state's keys retire at the next scheduled rotations (an intermediate's at its next renewal)",
		})
	}
	return out
}
