package statusui

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// Expiry thresholds, the same as the audit findings'.
const (
	expiryWarning  = 30 * 24 * time.Hour
	expiryCritical = 7 * 24 * time.Hour
)

// page is everything the template draws, computed from one snapshot.
type page struct {
	TrustDomain string
	Actor       string
	Leader      bool
	Generated   stamp
	Summary     summary
	Rows        []tdRow
	Graph       graph
	Timeline    timeline
	Authorities []authRow
	// Evaluated is false when no findings function was given.
	Evaluated bool
	Findings  []findingRow
	// Policy is nil when the snapshot carries no trust policy state.
	Policy *policyPanel
	// Issuers are the OIDC issuers of JWT-SVIDs; nil hides their panel.
	Issuers []issuerRow
	// Tainted are the own CA's authorities tainted and not yet revoked,
	// shown above everything else until they are.
	Tainted []taintedRow
}

// taintedRow is one tainted authority of the own CA.
type taintedRow struct {
	What   string // "root 03 · CN", "JWT key k-old"
	Since  stamp
	Revoke string // the command that revokes it
}

// stamp is one instant shown as a date, a distance from the snapshot
// time, and machine-readable.
type stamp struct {
	Set      bool
	Abs, Rel string
	ISO      string
}

type summary struct {
	// Static counts the trust domains relayed from bundle files,
	// BundleSet those set at run time by trustbridge bundle set.
	TrustDomains, Federated, Static     int
	BundleSet, Local                    int
	OK, Failing, Stale, Pending         int
	X509, Keys                          int
	Expiry                              stamp
	ExpiryClass, ExpiryWhat             string
	Critical, Warning                   int
	ActiveRoots, PreparedRoots, Retired int
	// JWT is the own CA's JWT signing keys, set when it mints JWT-SVIDs.
	JWT *keyCounts
	// Upstream is the upstream authority signing the own CA's
	// intermediate, set in upstream mode.
	Upstream *upstreamCard
}

// upstreamCard is the upstream authority's health as the summary shows it.
type upstreamCard struct {
	Name         string
	LastSuccess  stamp
	Failing      bool
	Failures     int
	FailingSince stamp
	LastError    string
	LastTry      stamp
	// NextTry is when the upstream is asked again; Refused says the last
	// failure was a refusal, which asking again does not mend.
	NextTry stamp
	Refused bool
	// IntermediateUntil is when the active intermediate expires, and
	// IntermediateClass its authorityExpiryClass.
	IntermediateUntil stamp
	IntermediateClass string
	// Class is the card's: bad when the intermediate is (nearly) gone, or
	// there is none while the upstream fails, warn while the upstream
	// fails or renewal is overdue, else good.
	Class string
}

// upstreamCardOf is nil outside upstream mode.
func upstreamCardOf(s api.Snapshot, now time.Time) *upstreamCard {
	if s.CA == nil || s.CA.Upstream == nil {
		return nil
	}
	u := s.CA.Upstream
	c := &upstreamCard{Name: u.Name, LastSuccess: stampOf(u.LastSuccess, now), Failing: u.Failures > 0, Failures: u.Failures}
	if c.Failing {
		c.FailingSince, c.LastError, c.LastTry = stampOf(u.FailingSince, now), u.LastError, stampOf(u.LastErrorAt, now)
		c.NextTry, c.Refused = stampOf(u.NextAttempt, now), u.Refused
	}
	for _, td := range s.TrustDomains {
		for _, a := range td.Authorities {
			if isIntermediate(td, a) && a.State == "active" && a.NotAfter != nil {
				c.IntermediateUntil, c.IntermediateClass = stampOf(a.NotAfter, now), authorityExpiryClass(a, now)
			}
		}
	}
	switch {
	case c.IntermediateClass == "critical" || c.IntermediateClass == "expired", c.Failing && !c.IntermediateUntil.Set:
		c.Class = "bad"
	case c.Failing || c.IntermediateClass == "warning":
		c.Class = "warn"
	default:
		c.Class = "good"
	}
	return c
}

// keyCounts counts keys by rotation state.
type keyCounts struct{ Active, Prepared, Retired int }

// tdRow is one line of the trust-domain table.
type tdRow struct {
	Name                 string
	Local                bool
	HasFederation        bool
	State, StateClass    string
	Origin, OriginDetail string
	Endpoint, Profile    string
	EndpointID           string
	Sequence             string
	LastSuccess, LastTry stamp
	NextRefresh          stamp
	LastError            string
	Failures             int
	Refusals             []refusal
	X509, Keys           int
	Expiry               stamp
	ExpiryClass          string
}

type refusal struct {
	Kind  string
	Count uint64
}

// authRow is one line of the authority table.
type authRow struct {
	TrustDomain string
	Kind        string
	State       string
	StateClass  string
	Name        string // subject or key ID
	Short, Full string // fingerprint
	From, Until stamp
	UntilClass  string
	Since       stamp
	Key, Sig    string
	CA          string
	// Thumbprint is a JWT/WIT key's RFC 7638 thumbprint, shortened.
	Thumbprint, ThumbprintFull string
	// Intermediate explains a local CA's upstream-signed intermediate.
	Intermediate string
	// Tainted is when the own CA's authority was tainted; Revoked marks
	// one revoked (struck through: no longer trusted).
	Tainted stamp
	Revoked bool
}

type findingRow struct {
	Severity, Class string
	Code            string
	TrustDomain     string
	Short, Full     string
	Message, Fix    string
}

// build turns a snapshot and its findings into the page. It is pure: all
// relative times are measured from s.Time.
func build(s api.Snapshot, fs []api.Finding, evaluated bool) page {
	now := s.Time.UTC()
	p := page{
		TrustDomain: s.TrustDomain, Actor: s.Actor, Leader: s.Leader,
		Generated: stampOf(&now, now), Evaluated: evaluated,
	}
	if s.Time.IsZero() {
		p.Generated = stamp{}
	}
	// earliest spans every trust domain: the summary names the one
	// authority that runs out first.
	var earliest *time.Time
	for _, td := range s.TrustDomains {
		row := tdRowOf(td, now)
		p.Rows = append(p.Rows, row)
		p.Summary.countTrustDomain(td, row)
		p.Tainted = append(p.Tainted, taintedRows(td, now)...)
		for _, a := range td.Authorities {
			p.Authorities = append(p.Authorities, authRowOf(td.Name, a, now))
			p.Summary.countAuthority(td, a)
			if isIntermediate(td, a) || a.State == stateRevoked {
				continue // judged by the upstream card and the audit's upstream findings; no longer trusted
			}
			if a.NotAfter != nil && (earliest == nil || a.NotAfter.Before(*earliest)) {
				earliest = a.NotAfter
				p.Summary.Expiry = stampOf(a.NotAfter, now)
				p.Summary.ExpiryClass = expiryClass(*a.NotAfter, now)
				p.Summary.ExpiryWhat = td.Name + " · " + displayName(a)
			}
		}
	}
	p.Findings = findingRows(fs, &p.Summary)
	p.Graph = layoutGraph(s)
	p.Timeline = layoutTimeline(s, now)
	p.Policy = policyPanelOf(s)
	p.Issuers = issuerRowsOf(s)
	p.Summary.Upstream = upstreamCardOf(s, now)
	return p
}

// countTrustDomain adds td, whose table row is row, to the summary's
// counts by kind and, for a federated one, by the state its row shows,
// so that the summary and the table never disagree.
func (sum *summary) countTrustDomain(td api.TrustDomain, row tdRow) {
	sum.TrustDomains++
	if td.Local && td.JWTIssuer {
		sum.JWT = jwtKeyCounts(td)
	}
	switch {
	case row.HasFederation:
		sum.Federated++
		switch row.StateClass {
		case "ok":
			sum.OK++
		case "failing":
			sum.Failing++
		case "stale":
			sum.Stale++
		default:
			sum.Pending++
		}
	case td.Local:
		sum.Local++
	case slices.Contains(td.Sources, api.OriginStatic):
		sum.BundleSet++
	default:
		sum.Static++
	}
}

// countAuthority adds a, an authority of td, to the summary's counts by
// kind and, for the local CA's roots, by rotation state.
func (sum *summary) countAuthority(td api.TrustDomain, a api.Authority) {
	if isIntermediate(td, a) || a.State == stateRevoked {
		return // not trusted: the upstream's roots are; revoked
	}
	if a.Kind == api.KindX509 {
		sum.X509++
	} else {
		sum.Keys++
	}
	if td.Local && a.Kind == api.KindX509 {
		switch a.State {
		case "active":
			sum.ActiveRoots++
		case "prepared":
			sum.PreparedRoots++
		case "retired":
			sum.Retired++
		}
	}
}

// findingRows is the findings table, most severe first (a stable sort,
// so equal severities keep the evaluator's order), counting critical and
// warning findings into sum. It is nil when there are no findings.
func findingRows(fs []api.Finding, sum *summary) []findingRow {
	sorted := slices.Clone(fs)
	slices.SortStableFunc(sorted, func(a, b api.Finding) int {
		return cmp.Compare(severityRank(a.Severity), severityRank(b.Severity))
	})
	var rows []findingRow
	for _, f := range sorted {
		row := findingRow{
			Severity: string(f.Severity), Class: severityClass(f.Severity), Code: f.Code,
			TrustDomain: f.TrustDomain, Short: shortFP(f.Authority), Full: f.Authority,
			Message: f.Message, Fix: f.Fix,
		}
		if row.Severity == "" {
			row.Severity = "unknown"
		}
		switch f.Severity {
		case api.SeverityCritical:
			sum.Critical++
		case api.SeverityWarning:
			sum.Warning++
		}
		rows = append(rows, row)
	}
	return rows
}

func tdRowOf(td api.TrustDomain, now time.Time) tdRow {
	row := tdRow{Name: td.Name, Local: td.Local, Sequence: "—"}
	if td.Sequence != nil {
		row.Sequence = strconv.FormatUint(*td.Sequence, 10)
	}
	row.State, row.StateClass = tdState(td)
	row.Origin, row.OriginDetail = origin(td)
	if f := td.Federation; f != nil {
		row.HasFederation = true
		row.Endpoint, row.Profile, row.EndpointID = f.EndpointURL, f.Profile, f.EndpointSPIFFEID
		row.LastSuccess = stampOf(f.LastSuccess, now)
		row.LastTry = stampOf(f.LastAttempt, now)
		row.NextRefresh = stampOf(f.NextRefresh, now)
		row.LastError, row.Failures = f.LastError, f.ConsecutiveFailures
		for kind, n := range f.Refusals {
			row.Refusals = append(row.Refusals, refusal{Kind: kind, Count: n})
		}
		slices.SortFunc(row.Refusals, func(a, b refusal) int { return cmp.Compare(a.Kind, b.Kind) })
	}
	var earliest *time.Time
	for _, a := range td.Authorities {
		switch {
		case isIntermediate(td, a):
			continue // signs for the trust domain; not one of its trusted roots
		case a.Kind == api.KindX509:
			row.X509++
		default:
			row.Keys++
		}
		if a.NotAfter != nil && (earliest == nil || a.NotAfter.Before(*earliest)) {
			earliest = a.NotAfter
		}
	}
	if earliest != nil {
		row.Expiry, row.ExpiryClass = stampOf(earliest, now), expiryClass(*earliest, now)
	}
	return row
}

// tdState is the badge text and its CSS class. Classes come from a fixed
// set so that no snapshot value reaches a class attribute.
func tdState(td api.TrustDomain) (text, class string) {
	switch {
	case td.Local:
		return "local", "local"
	case td.Federation != nil:
		switch td.Federation.State {
		case "ok", "failing", "stale", "pending":
			return td.Federation.State, td.Federation.State
		}
		if td.Federation.State == "" {
			return "unknown", "unknown"
		}
		return td.Federation.State, "unknown"
	default:
		return "static", "static"
	}
}

// origin says where a trust relationship is configured: a short label and
// the detail (flag, file path, resource name).
func origin(td api.TrustDomain) (label, detail string) {
	var files []string
	for _, src := range td.Sources {
		if p, ok := strings.CutPrefix(src, "file:"); ok {
			files = append(files, p)
		}
	}
	if td.Local {
		if len(files) > 0 {
			return "own CA", "+ bundle file " + strings.Join(files, ", ")
		}
		return "own CA", ""
	}
	if f := td.Federation; f != nil {
		switch {
		case f.Origin == "flag":
			return "flag", "--federate"
		case f.Origin == "file":
			return "config file", "--federation-config"
		case strings.HasPrefix(f.Origin, "crd:"):
			return "CRD", strings.TrimPrefix(f.Origin, "crd:")
		case f.Origin != "":
			return f.Origin, ""
		}
		return "—", ""
	}
	if slices.Contains(td.Sources, api.OriginStatic) {
		// The trust store's source of bundle set is named as its origin.
		return "bundle set", "set at run time by trustbridge bundle set"
	}
	if len(files) > 0 {
		return "bundle file", strings.Join(files, ", ")
	}
	if len(td.Sources) > 0 {
		return strings.Join(td.Sources, ", "), ""
	}
	return "—", ""
}

func authRowOf(td string, a api.Authority, now time.Time) authRow {
	row := authRow{
		TrustDomain: td, Kind: a.Kind, Name: displayName(a),
		Short: shortFP(a.SHA256), Full: a.SHA256,
		From: stampOf(a.NotBefore, now), Until: stampOf(a.NotAfter, now),
		Since: stampOf(a.Since, now), Sig: a.SignatureAlgorithm,
	}
	switch a.Kind {
	case api.KindX509:
		row.Kind = "X.509"
	case api.KindJWT:
		row.Kind = "JWT"
	case api.KindWIT:
		row.Kind = "WIT"
	}
	row.State, row.StateClass = a.State, rootStateClass(a.State)
	if row.State == "" {
		row.State, row.StateClass = "trusted", "trusted"
	}
	if a.NotAfter != nil {
		row.UntilClass = authorityExpiryClass(a, now)
	}
	if a.Upstream != "" {
		row.Kind, row.Intermediate = "X.509 intermediate", "signs for the trust domain, signed by upstream "+a.Upstream+"; not published, not trusted"
	}
	if a.PublicKeyAlgorithm != "" {
		row.Key = a.PublicKeyAlgorithm
		switch {
		case a.Curve != "":
			row.Key += " " + a.Curve
		case a.KeyBits > 0:
			row.Key += " " + strconv.Itoa(a.KeyBits)
		}
	}
	if a.Kind != api.KindX509 {
		keyRow(&row, a, now)
	}
	if a.Kind == api.KindX509 && !a.IsCA {
		row.CA = "not a CA"
	}
	row.Tainted, row.Revoked = stampOf(a.TaintedAt, now), a.State == stateRevoked
	return row
}

// stateRevoked is the state of an own authority an operator revoked.
const stateRevoked = "revoked"

// taintedRows are td's own authorities tainted and not yet revoked.
func taintedRows(td api.TrustDomain, now time.Time) []taintedRow {
	if !td.Local {
		return nil
	}
	var out []taintedRow
	for _, a := range td.Authorities {
		if a.TaintedAt == nil || a.State == stateRevoked {
			continue
		}
		row := taintedRow{What: "root " + a.ID + " · " + displayName(a), Since: stampOf(a.TaintedAt, now),
			Revoke: "trustbridge ca authority revoke --x509 " + a.ID}
		switch {
		case a.Kind == api.KindJWT:
			row.What, row.Revoke = "JWT key "+a.KeyID, "trustbridge ca authority revoke --jwt "+a.KeyID
		case a.Upstream != "":
			row.What = "intermediate " + a.ID + " · " + displayName(a)
		}
		out = append(out, row)
	}
	return out
}

func rootStateClass(s string) string {
	switch s {
	case "active", "prepared", "retired", "external", stateRevoked:
		return s
	}
	return "trusted"
}

// displayName is the common name of an X.509 subject when it has one,
// else the whole subject, else the key ID.
func displayName(a api.Authority) string {
	if a.Subject != "" {
		if cn := commonName(a.Subject); cn != "" {
			return cn
		}
		return a.Subject
	}
	if a.KeyID != "" {
		return "key " + a.KeyID
	}
	return "(unnamed)"
}

// commonName picks CN=... out of an RFC 2253 string as pkix.Name.String
// writes it (commas inside values are escaped with a backslash).
func commonName(subject string) string {
	var parts []string
	var cur strings.Builder
	esc := false
	for _, r := range subject {
		switch {
		case esc:
			cur.WriteRune(r)
			esc = false
		case r == '\\':
			esc = true
		case r == ',' || r == '+':
			parts = append(parts, cur.String())
			cur.Reset()
		default:
			cur.WriteRune(r)
		}
	}
	parts = append(parts, cur.String())
	for _, p := range parts {
		if v, ok := strings.CutPrefix(strings.TrimSpace(p), "CN="); ok {
			return v
		}
	}
	return ""
}

func shortFP(fp string) string {
	if fp == "" {
		return ""
	}
	return truncate(fp, 12)
}

func severityRank(s api.Severity) int {
	switch s {
	case api.SeverityCritical:
		return 0
	case api.SeverityWarning:
		return 1
	}
	return 2
}

func severityClass(s api.Severity) string {
	switch s {
	case api.SeverityCritical:
		return "critical"
	case api.SeverityWarning:
		return "warning"
	}
	return "unknown"
}

// expiryClass grades how close an expiry is: expired, critical (7 days),
// warning (30 days) or fine.
// isIntermediate says whether a is the local CA's upstream-signed
// intermediate (upstream mode): the snapshot lists it with the local
// trust domain's authorities, but peers trust the upstream's roots, and
// its short life is by design.
func isIntermediate(td api.TrustDomain, a api.Authority) bool {
	return td.Local && a.Upstream != ""
}

// authorityExpiryClass is expiryClass, except for an intermediate: it
// lives days by design and is renewed at half its life, so it is judged
// by the share of its life left: a warning under a quarter (renewal is
// overdue), critical under an eighth.
func authorityExpiryClass(a api.Authority, now time.Time) string {
	if a.Upstream == "" || a.NotBefore == nil {
		return expiryClass(*a.NotAfter, now)
	}
	life, left := a.NotAfter.Sub(*a.NotBefore), a.NotAfter.Sub(now)
	switch {
	case left <= 0:
		return "expired"
	case left < life/8:
		return "critical"
	case left < life/4:
		return "warning"
	}
	return "fine"
}

func expiryClass(notAfter, now time.Time) string {
	switch d := notAfter.Sub(now); {
	case d <= 0:
		return "expired"
	case d <= expiryCritical:
		return "critical"
	case d <= expiryWarning:
		return "warning"
	}
	return "fine"
}

func stampOf(t *time.Time, now time.Time) stamp {
	if t == nil || t.IsZero() {
		return stamp{}
	}
	u := t.UTC()
	return stamp{Set: true, Abs: u.Format("2006-01-02 15:04"), Rel: api.Relative(u.Sub(now)), ISO: u.Format(time.RFC3339)}
}

// truncate shortens s to at most n runes, marking the cut with an
// ellipsis.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// keyRow fills what a JWT or WIT key shows besides an X.509 root: the
// algorithm it implies where a root shows its signature, its thumbprint,
// and for our own JWT keys their life. That life is drawn expired or
// fine, never by the roots' 30-day thresholds: JWT keys are short-lived
// by design, and a late successor is a finding of its own.
func keyRow(row *authRow, a api.Authority, now time.Time) {
	row.Sig = a.Algorithm
	row.Thumbprint, row.ThumbprintFull = shortFP(a.Thumbprint), a.Thumbprint
	k := a.JWTKey
	if k == nil {
		return
	}
	row.From, row.Until = stampOf(k.CreatedAt, now), stampOf(k.NotAfter, now)
	if k.NotAfter != nil {
		row.UntilClass = "fine"
		if !k.NotAfter.After(now) {
			row.UntilClass = "expired"
		}
	}
}

// jwtKeyCounts counts the own CA's JWT signing keys by state.
func jwtKeyCounts(td api.TrustDomain) *keyCounts {
	c := &keyCounts{}
	for _, a := range td.Authorities {
		if a.Kind != api.KindJWT || a.JWTKey == nil {
			continue
		}
		switch a.State {
		case "active":
			c.Active++
		case "prepared":
			c.Prepared++
		case "retired":
			c.Retired++
		}
	}
	return c
}
