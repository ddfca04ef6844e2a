package audit

import (
	"fmt"
	"strings"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// Finding codes of the identity map.
const (
	CodeIdentityConflict  = "identity_map_conflict"
	CodeIdentityAgentOnly = "identity_map_rule_agent_only"
	CodeIdentityRejected  = "identity_map_source_rejected"
)

// identityMapFindings judges the identity map of s: rules in conflict (a
// workload both select gets no identity), rules only node agents can
// evaluate (the server never grants their IDs, so a node agent asking for
// one is refused) and sources whose last change was refused (the previous
// rules still hold). A snapshot without identity_map is not judged.
func identityMapFindings(s api.Snapshot) []api.Finding {
	im := s.IdentityMap
	if im == nil {
		return nil
	}
	var out []api.Finding
	add := func(code, msg, fix string) {
		out = append(out, api.Finding{Severity: api.SeverityWarning, Code: code, Message: msg, Fix: fix})
	}
	for _, c := range im.Conflicts {
		// A snapshot is untrusted input: an empty message still makes a
		// finding that says what it is.
		if strings.TrimSpace(c) == "" {
			c = "the identity map has conflicting rules (the snapshot does not say which)"
		}
		add(CodeIdentityConflict, c,
			"make the rules' selectors disjoint (another namespace, a podLabels NotIn) or their templates equal: trustbridge identity explain shows what one pod gets")
	}
	for _, a := range im.AgentOnly {
		if strings.TrimSpace(a) == "" {
			a = "an identity map rule needs facts only node agents attest (the snapshot does not say which)"
		}
		add(CodeIdentityAgentOnly, a,
			"select pods by namespace, serviceAccount and podLabels and use only their facts in templates, or give the workloads their identity another way: docs/identity-map.md")
	}
	for _, src := range im.Sources {
		if src.LastError != "" {
			add(CodeIdentityRejected,
				fmt.Sprintf("identity map source %s: its last change was refused, the previous rules stay in force: %s", src.Source, src.LastError),
				"fix the source (trustbridge identity explain --identity-map FILE checks a file) so the map in force is the one written down")
		}
	}
	return out
}
