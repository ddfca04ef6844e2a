package ca

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// survey is step 1: the active authority, and the peers to wait for.
// It refuses, before anything changes, a server that does not count
// what its authorities sign: the re-issue could not be seen.
func (d *drill) survey(ctx context.Context) (api.CAAuthority, error) {
	a, list, err := d.authority(ctx, "")
	if err != nil {
		return a, err
	}
	if a.Signed == nil {
		return a, fmt.Errorf("the server at %s does not count what its authorities sign (ca authority list shows no SIGNED): "+
			"the drill could not see when the workloads have re-issued; nothing was changed", d.c.Addr)
	}
	if why := a.Signed.Incomplete; why != "" && !d.o.force {
		return a, fmt.Errorf("the server's counts cannot vouch for everything %s %s signed (%s): the drill could not tell when "+
			"the workloads have re-issued, and the server would refuse the revocation; nothing was changed. Run it with --force "+
			"to wait for what is counted and revoke then", d.what, a.ID, cli.Printable(why))
	}
	if a.Kind == api.CAKindIntermediate {
		d.what = "intermediate"
	}
	d.res.TrustDomain, d.res.Tainted = list.TrustDomain, a.ID
	peers, err := d.peers(ctx)
	if err != nil {
		return a, err
	}
	d.mark(stepList, fmt.Sprintf("active %s %s, %d in use; bundle sequence %d; %s", d.what, a.ID, a.Signed.InUse, list.Sequence, peers))
	return a, nil
}

// peers picks the clients of our bundle endpoint to wait for, those
// whose last fetch is within peerWindow refresh hints before the drill,
// and says which.
func (d *drill) peers(ctx context.Context) (string, error) {
	var trust api.Trust
	if err := getJSON(ctx, d.c, "/v1/trust", &trust); err != nil {
		return "", err
	}
	var fetchers api.BundleFetchers
	err := getJSON(ctx, d.c, "/v1/bundle/fetchers", &fetchers)
	var ae *cli.AdminError
	if errors.As(err, &ae) && ae.Code == http.StatusNotFound {
		return "the server has no bundle endpoint: no peer to wait for", nil
	}
	if err != nil {
		return "", err
	}
	hint := time.Duration(trust.RefreshHintSeconds) * time.Second
	since := d.res.start.Add(-peerWindow * hint)
	var names []string
	for _, f := range fetchers.Fetchers {
		if !f.LastFetch.Before(since) {
			d.res.Peers = append(d.res.Peers, f.Client)
			names = append(names, fmt.Sprintf("%s (%q, sequence %d)", f.Client, f.UserAgent, f.Sequence))
		}
	}
	msg := fmt.Sprintf("waits for %s that fetched our bundle since %s (%d refresh hints of %s)",
		count(len(names), "client"), stamp(since), peerWindow, hint)
	if len(names) > 0 {
		msg += ": " + strings.Join(names, ", ")
	}
	if older := len(fetchers.Fetchers) - len(names); older > 0 {
		msg += fmt.Sprintf("; %s that fetched before, not waited for", count(older, "client"))
	}
	return msg, nil
}

// prepare is step 2: the successor, once the server published it (it
// cannot be activated before). In upstream mode it signs at once.
func (d *drill) prepare(ctx context.Context) (api.CAAuthority, error) {
	res, err := postAuthorityChange(ctx, d.c, api.CAAuthorityChange{Action: "prepare", JWT: d.o.jwt})
	if err != nil {
		return res.Authority, err
	}
	b := res.Authority
	d.res.Successor = b.ID
	err = d.poll(ctx, func(ctx context.Context) (bool, error) {
		b, _, err = d.authority(ctx, b.ID)
		return b.PublishedAt != nil || b.State == "active", err
	})
	if errors.Is(err, errTimedOut) {
		return b, fmt.Errorf("%s %s was prepared but not published within --timeout %s: is the server's CA running? "+
			"nothing else changed: activate it with `trustbridge ca authority activate --%s --now` once published, or revoke it", d.what, b.ID, d.o.timeout, d.res.Kind)
	}
	if err != nil {
		return b, err
	}
	d.mark(stepPrepare, fmt.Sprintf("%s; published at %s", res.Message, optStamp(b.PublishedAt)))
	return b, nil
}

// activate is step 3: b signs from now, without the publication lead.
func (d *drill) activate(ctx context.Context, b api.CAAuthority) error {
	if b.State == "active" {
		d.mark(stepActivate, fmt.Sprintf("%s %s signs already (upstream mode: it signs once the upstream signed it)", d.what, b.ID))
		return nil
	}
	res, err := postAuthorityChange(ctx, d.c, api.CAAuthorityChange{Action: "activate", JWT: d.o.jwt, ID: b.ID, Now: true})
	if err != nil {
		return err
	}
	d.mark(stepActivate, res.Message, res.Warnings...)
	return nil
}

// taint is step 4.
func (d *drill) taint(ctx context.Context, a api.CAAuthority) error {
	res, err := postAuthorityChange(ctx, d.c, api.CAAuthorityChange{Action: "taint", JWT: d.o.jwt, ID: a.ID})
	if err != nil {
		return err
	}
	d.mark(stepTaint, res.Message)
	return nil
}

// waitReissued is step 5: until nothing a signed is in use, printing
// the count as it falls.
func (d *drill) waitReissued(ctx context.Context, a api.CAAuthority) error {
	inUse := -1
	var last time.Time
	err := d.poll(ctx, func(ctx context.Context) (bool, error) {
		now, _, err := d.authority(ctx, a.ID)
		if err == nil && now.Signed == nil {
			err = errors.New("the server stopped counting what its authorities sign")
		}
		if err != nil {
			return false, err
		}
		switch {
		case inUse < 0 && d.o.jwt && now.Signed.InUse > 0:
			d.note("in use: %d (JWT-SVIDs are not renewed: the last expires at %s)", now.Signed.InUse, stamp(now.Signed.Last))
		case inUse < 0:
			d.note("in use: %d", now.Signed.InUse)
		case now.Signed.InUse != inUse:
			d.note("in use: %d → %d", inUse, now.Signed.InUse)
		}
		inUse, last = now.Signed.InUse, now.Signed.Last
		return inUse == 0, nil
	})
	if errors.Is(err, errTimedOut) {
		return fmt.Errorf("%s %s: %d workloads still present what it signed after --timeout %s (the last expires at %s); "+
			"it stays tainted, and critical in `trustbridge audit`, until revoked: find them (the server's log names each "+
			"re-issue), then `trustbridge ca authority revoke --%s %s`, with --force to fail those left",
			d.what, a.ID, inUse, d.o.timeout, stamp(last), d.res.Kind, a.ID)
	}
	if err != nil {
		return err
	}
	d.mark(stepReissued, fmt.Sprintf("nothing %s %s signed is in use any more", d.what, a.ID))
	return nil
}

// revoke is step 6: a leaves the bundle; its sequence is what the peers
// must fetch.
func (d *drill) revoke(ctx context.Context, a api.CAAuthority) error {
	res, err := postAuthorityChange(ctx, d.c, api.CAAuthorityChange{Action: "revoke", JWT: d.o.jwt, ID: a.ID, Force: d.o.force})
	if err != nil {
		return err
	}
	list, err := listAuthorities(ctx, d.c)
	if err != nil {
		return err
	}
	d.res.RevokedSequence = list.Sequence
	d.mark(stepRevoke, res.Message)
	return nil
}

// waitPeers is step 7: until every peer of step 1 fetched the bundle at
// the revocation's sequence or later.
func (d *drill) waitPeers(ctx context.Context) error {
	if len(d.res.Peers) == 0 {
		d.mark(stepRefetched, "no peer to wait for")
		return nil
	}
	seen := map[string]bool{}
	err := d.poll(ctx, func(ctx context.Context) (bool, error) {
		var fetchers api.BundleFetchers
		if err := getJSON(ctx, d.c, "/v1/bundle/fetchers", &fetchers); err != nil {
			return false, err
		}
		for _, f := range fetchers.Fetchers {
			if slices.Contains(d.res.Peers, f.Client) && !seen[f.Client] && f.Sequence >= d.res.RevokedSequence {
				seen[f.Client] = true
				d.note("%s fetched sequence %d at %s", f.Client, f.Sequence, stamp(f.LastFetch))
			}
		}
		return len(seen) == len(d.res.Peers), nil
	})
	for _, p := range d.res.Peers {
		if !seen[p] {
			d.res.Lagging = append(d.res.Lagging, p)
		}
	}
	if errors.Is(err, errTimedOut) {
		return fmt.Errorf("%s %s is revoked (sequence %d), but after --timeout %s %s had not fetched it: they trust it until they do; "+
			"check their federation status", d.what, d.res.Tainted, d.res.RevokedSequence, d.o.timeout, strings.Join(d.res.Lagging, ", "))
	}
	if err != nil {
		return err
	}
	d.mark(stepRefetched, fmt.Sprintf("every peer (%s) fetched sequence %d or later", count(len(d.res.Peers), "client"), d.res.RevokedSequence))
	return nil
}

// report prints the timeline in out's format, and returns err, the
// drill's outcome. A drill that failed before its first step has no
// timeline to print.
func (d *drill) report(out *cli.OutputFlag, w io.Writer, err error) error {
	if len(d.res.Steps) == 0 {
		return err
	}
	if err != nil {
		d.res.Error = err.Error()
	}
	if werr := out.Print(w, d.res, d.table()); werr != nil {
		return errors.Join(err, werr)
	}
	return err
}

// table is the timeline for people, one row per step (named by it), the
// outcome below.
func (d *drill) table() cli.Table {
	t := cli.Table{Columns: []cli.Column{{Name: "Step"}, {Name: "At"}, {Name: "Since start"}, {Name: "Since previous"}}, Before: "\n"}
	for _, s := range d.res.Steps {
		t.Rows = append(t.Rows, cli.Row{Name: s.Step, Cells: []any{s.Step, s.At.Format("15:04:05.000Z"),
			elapsed(seconds(s.SinceStartSeconds)), elapsed(seconds(s.SincePreviousSeconds))}})
	}
	summary := fmt.Sprintf("\ntrust domain %s: active %s %s", d.res.TrustDomain, d.what, d.res.Tainted)
	if slices.ContainsFunc(d.res.Steps, func(s drillStep) bool { return s.Step == stepActivate }) {
		summary = fmt.Sprintf("\ntrust domain %s: %s %s replaced by %s", d.res.TrustDomain, d.what, d.res.Tainted, d.res.Successor)
	}
	if d.res.RevokedSequence != 0 {
		summary += fmt.Sprintf(", revoked at sequence %d", d.res.RevokedSequence)
	}
	if d.res.Error != "" {
		summary += "; stopped: see the error"
	}
	t.After = summary + "\n"
	return t
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// count is "1 client", "2 clients".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func stamp(t time.Time) string { return optStamp(&t) }
