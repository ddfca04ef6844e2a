package server

import (
	"fmt"
	"time"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/server/audit"
)

// caHealth is what the audit trail reads of the CA's health; *ca.Authority
// has it.
type caHealth interface {
	CheckError() error
	Upstream() (ca.UpstreamStatus, bool)
}

// maxHealthReason bounds the error text an entry quotes (the ca package
// bounds an upstream's; other errors are ours, but an entry must stay
// far below audit.MaxLineSize whatever they say).
const maxHealthReason = 4096

// healthSeen is the CA's health as last recorded.
type healthSeen struct {
	checkErr     string    // "" while checks succeed
	upstreamDown time.Time // the outage's start; zero while the upstream answers
}

// healthEntriesLocked are the entries for how the CA's health turned
// since last seen: a scheduled check that starts to fail (the key manager
// refused a new key, no valid intermediate is left) or ceases to, and an
// upstream outage that starts or ends. One entry per turn, not per
// failed retry: the log stays a record of changes, and the metrics count
// every attempt. t.mu is held.
func (t *auditTrail) healthEntriesLocked(h caHealth, td string) []audit.Entry {
	if t.leader != nil && !t.leader() {
		// A follower records nothing; a new leader starts from a clean
		// slate, so a failure that began before it led is written when
		// it takes the lead (Recheck), and no recovery comes without its
		// failure.
		t.health = healthSeen{}
		return nil
	}
	var entries []audit.Entry
	checkErr := ""
	if err := h.CheckError(); err != nil {
		checkErr = clipText(err.Error(), maxHealthReason)
	}
	switch {
	case checkErr != "" && t.health.checkErr == "":
		entries = append(entries, audit.Entry{Event: "ca_check_failed", TrustDomain: td,
			Reason: checkErr + " (the CA signs only with the valid material it already holds, if any; /readyz fails until this is fixed)"})
	case checkErr == "" && t.health.checkErr != "":
		entries = append(entries, audit.Entry{Event: "ca_check_recovered", TrustDomain: td,
			Reason: "the CA's checks succeed again (last error: " + t.health.checkErr + ")"})
	}
	t.health.checkErr = checkErr

	st, ok := h.Upstream()
	if !ok {
		return entries
	}
	switch {
	case st.Failures > 0 && t.health.upstreamDown.IsZero():
		t.health.upstreamDown = st.FailingSince
		if t.health.upstreamDown.IsZero() { // a status without the outage's start
			t.health.upstreamDown = st.LastErrorAt
		}
		entries = append(entries, audit.Entry{Event: "upstream_failed", TrustDomain: td, Reason: upstreamFailedReason(st)})
	case st.Failures == 0 && !t.health.upstreamDown.IsZero():
		entries = append(entries, audit.Entry{Event: "upstream_recovered", TrustDomain: td,
			Reason: fmt.Sprintf("upstream %s answered again after failing since %s (last error: %s)",
				st.Name, t.health.upstreamDown.UTC().Format(time.RFC3339), clipText(st.LastError, maxHealthReason))})
		t.health.upstreamDown = time.Time{}
	}
	return entries
}

// upstreamFailedReason is the reason of an upstream_failed entry.
func upstreamFailedReason(st ca.UpstreamStatus) string {
	retry := "retried with backoff"
	if st.Refused {
		retry = "refused, which asking again does not mend: fix what it names; asked again every 5m"
	}
	return fmt.Sprintf("upstream %s: %s (%s; the CA signs with its current intermediate while it is valid, and with none signs nothing)",
		st.Name, clipText(st.LastError, maxHealthReason), retry)
}
