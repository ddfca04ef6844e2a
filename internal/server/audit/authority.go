package audit

import (
	"fmt"
	"time"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// CodeAuthorityTainted is one of the local CA's authorities tainted and
// not revoked yet: suspected of compromise, and still trusted.
const CodeAuthorityTainted = "ca_authority_tainted"

// stateRevoked is the state of an authority an operator revoked: no
// longer published, listed until it expires.
const stateRevoked = "revoked"

// taintFindings report each of the local CA's own authorities (a root,
// an upstream-signed intermediate, a JWT key) that is tainted and not yet
// revoked: critical until it is, since peers and workloads still trust a
// key suspected of compromise.
func taintFindings(td api.TrustDomain) []api.Finding {
	if !td.Local {
		return nil
	}
	var out []api.Finding
	for _, a := range td.Authorities {
		if a.TaintedAt == nil || a.State == stateRevoked {
			continue
		}
		what, flag, id := "root", "--x509", a.ID
		switch {
		case a.Kind == api.KindJWT:
			what, flag, id = "JWT key", "--jwt", a.KeyID
		case a.Upstream != "":
			what = "intermediate"
		}
		out = append(out, api.Finding{Severity: api.SeverityCritical, Code: CodeAuthorityTainted, TrustDomain: td.Name, Authority: a.SHA256,
			Message: fmt.Sprintf("%s %s of %s has been tainted since %s: it signs nothing more and clients re-issue what it signed, but it is still trusted by every workload and peer",
				what, id, td.Name, a.TaintedAt.UTC().Format(time.RFC3339)),
			Fix: fmt.Sprintf("revoke it with `trustbridge ca authority revoke %s %s` once its workloads were re-issued (`trustbridge ca authority list` shows none in use)", flag, id),
		})
	}
	return out
}
