package ca

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

const drillLong = `Run the whole incident-response sequence of trustbridge ca authority
against the running server, for real, and print its timeline: how long the
trust domain takes to move off its active authority. Each step is printed
as it happens, with its time and the time since the drill started:

  1. list: the active authority (A), and the peers to wait for: every
     client of our bundle endpoint whose last fetch is within 3 refresh
     hints before the drill (GET /v1/bundle/fetchers).
  2. prepare: a successor (B), published in the bundle.
  3. activate B --now: it signs every new certificate from now (the
     warnings name the peers that have not fetched it yet).
  4. taint A: clients re-issue what it signed, over the server's
     --reissue-spread.
  5. reissued: nothing A signed is in use any more (ca authority list,
     SIGNED in use: 0), polled every --poll. JWT-SVIDs are not renewed:
     with --jwt this lasts until the last one A minted expires.
  6. revoke A: it leaves the bundle; the sequence moves to S.
  7. refetched: every peer of step 1 has fetched sequence S or later.

The drill retires and revokes the trust domain's active authority: run it
on a lab setup, or in an incident as the scripted response, and say so with
--yes. A wait that outlasts --timeout stops the drill with what to do: when
re-issue does not finish, A stays tainted, and critical in trustbridge
audit, until it is revoked. The drill needs a server that counts what its
authorities sign (the admin token or socket, as ca authority does); a
server without a bundle endpoint has no peers to wait for.

With -o json (or yaml) the progress goes to stderr and the timeline, with
the authorities, the peers and any that lagged, to stdout.`

// Steps of the drill, as its timeline names them.
const (
	stepList      = "list"
	stepPrepare   = "prepare"
	stepActivate  = "activate"
	stepTaint     = "taint"
	stepReissued  = "reissued"
	stepRevoke    = "revoke"
	stepRefetched = "refetched"
)

// peerWindow is how many refresh hints before the drill a client's last
// fetch may be for the drill to wait for it: a peer polling at the hint
// fetches within one; three allow for its back-off after a failure.
const peerWindow = 3

// drillOptions are ca drill's flags.
type drillOptions struct {
	x509, jwt, yes bool
	// force revokes although the server's counts cannot vouch for
	// everything the authority signed (SignedCount.Incomplete).
	force         bool
	timeout, poll time.Duration
}

// check refuses what the drill cannot run with, before it changes
// anything.
func (o drillOptions) check() error {
	switch {
	case o.x509 == o.jwt:
		return errors.New("give exactly one of --x509 and --jwt")
	case !o.yes:
		return errors.New("the drill retires and revokes the trust domain's active authority for real: " +
			"run it on a lab setup, or in an incident as the scripted response, and give --yes")
	case o.timeout <= 0 || o.poll <= 0:
		return fmt.Errorf("--timeout %s and --poll %s must be positive", o.timeout, o.poll)
	}
	return nil
}

func newDrillCmd(e cli.Env) *cobra.Command {
	var (
		c cli.AdminClient
		o drillOptions
	)
	cmd := &cobra.Command{
		Use:   "drill --x509|--jwt --yes",
		Short: "Replace, taint and revoke the active authority for real, and print how long each step took",
		Long:  drillLong,
		Example: `  # a lab server whose admin token is in ./data
  trustbridge ca drill --x509 --yes
  trustbridge ca drill --jwt --yes --timeout 15m -o json > drill.json`,
		Args: cobra.NoArgs,
	}
	out := cli.AddOutputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := o.check(); err != nil {
			return err
		}
		if err := out.Check(); err != nil {
			return err
		}
		progress := e.Out
		if !out.Human() {
			progress = e.Err
		}
		d := newDrill(e, cli.AdminFrom(cmd, &c), o, progress)
		return d.report(out, e.Out, d.run(cmd.Context()))
	}
	f := cmd.Flags()
	f.String("admin", "http://127.0.0.1:15014", cli.AdminFlagHelp)
	f.BoolVar(&o.x509, "x509", false, "drill the X.509 authority: the root, or in upstream mode the intermediate")
	f.BoolVar(&o.jwt, "jwt", false, "drill the JWT-SVID signing key")
	f.BoolVar(&o.yes, "yes", false, "run it: the active authority is retired, tainted and revoked for real")
	f.BoolVar(&o.force, "force", false, "drill although the server's counts cannot vouch for everything the active authority signed "+
		"(it restarted since the authority began signing, or several replicas sign): wait for what is counted, then revoke with --force")
	f.DurationVar(&o.timeout, "timeout", 10*time.Minute, "how long each wait (publication, re-issue, the peers' fetch) may last")
	f.DurationVar(&o.poll, "poll", time.Second, "how often to ask the server while waiting")
	c.AddAuthFlags(f)
	return cmd
}

// drillResult is the drill's timeline, as -o json prints it.
type drillResult struct {
	TrustDomain string `json:"trust_domain"`
	// Kind is x509 or jwt.
	Kind string `json:"kind"`
	// Tainted is the authority that was active (A), Successor the one
	// that replaced it (B).
	Tainted   string `json:"tainted"`
	Successor string `json:"successor,omitempty"`
	// RevokedSequence is the bundle's sequence after the revocation (S).
	RevokedSequence uint64 `json:"revoked_sequence,omitempty"`
	// Peers are the clients waited for; Lagging those that had not
	// fetched RevokedSequence when the wait timed out.
	Peers   []string    `json:"peers"`
	Lagging []string    `json:"lagging,omitempty"`
	Steps   []drillStep `json:"steps"`
	Error   string      `json:"error,omitempty"`
	start   time.Time   // when the drill began
}

// drillStep is one step of the timeline.
type drillStep struct {
	Step                 string    `json:"step"`
	At                   time.Time `json:"at"`
	SinceStartSeconds    float64   `json:"since_start_seconds"`
	SincePreviousSeconds float64   `json:"since_previous_seconds"`
	Detail               string    `json:"detail"`
	Warnings             []string  `json:"warnings,omitempty"`
}

// drill runs the sequence against one server.
type drill struct {
	e   cli.Env
	c   *cli.AdminClient
	o   drillOptions
	w   io.Writer // progress
	res drillResult
	// what names the drilled authorities in messages: root,
	// intermediate or JWT key.
	what string
}

func newDrill(e cli.Env, c *cli.AdminClient, o drillOptions, w io.Writer) *drill {
	kind, what := "x509", "root"
	if o.jwt {
		kind, what = "jwt", "JWT key"
	}
	return &drill{e: e, c: c, o: o, w: w, what: what, res: drillResult{Kind: kind, Peers: []string{}, Steps: []drillStep{}, start: e.Now()}}
}

// run is the sequence; it stops at the first step that fails.
func (d *drill) run(ctx context.Context) error {
	a, err := d.survey(ctx)
	if err != nil {
		return err
	}
	b, err := d.prepare(ctx)
	if err != nil {
		return err
	}
	for _, step := range []func(context.Context) error{
		func(ctx context.Context) error { return d.activate(ctx, b) },
		func(ctx context.Context) error { return d.taint(ctx, a) },
		func(ctx context.Context) error { return d.waitReissued(ctx, a) },
		func(ctx context.Context) error { return d.revoke(ctx, a) },
		d.waitPeers,
	} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// mark records step as done now and prints it.
func (d *drill) mark(step, detail string, warnings ...string) {
	now := d.e.Now()
	prev := d.res.start
	if n := len(d.res.Steps); n > 0 {
		prev = d.res.Steps[n-1].At
	}
	d.res.Steps = append(d.res.Steps, drillStep{Step: step, At: now.UTC(), Detail: detail, Warnings: warnings,
		SinceStartSeconds: now.Sub(d.res.start).Seconds(), SincePreviousSeconds: now.Sub(prev).Seconds()})
	fmt.Fprintf(d.w, "%s  %-9s %-10s %s\n", now.UTC().Format("15:04:05.000"), "+"+elapsed(now.Sub(d.res.start)), step, cli.Printable(detail))
	for _, w := range warnings {
		fmt.Fprintln(d.w, "    warning:", cli.Printable(w))
	}
}

// note prints progress within a step.
func (d *drill) note(format string, args ...any) {
	now := d.e.Now()
	fmt.Fprintf(d.w, "%s  %-9s %-10s %s\n", now.UTC().Format("15:04:05.000"), "+"+elapsed(now.Sub(d.res.start)), "", cli.Printable(fmt.Sprintf(format, args...)))
}

func elapsed(d time.Duration) string { return d.Round(time.Millisecond).String() }

// authority is the drilled kind's authority id as the server lists it now.
func (d *drill) authority(ctx context.Context, id string) (api.CAAuthority, api.CAAuthorities, error) {
	list, err := listAuthorities(ctx, d.c)
	if err != nil {
		return api.CAAuthority{}, list, err
	}
	items := list.X509
	if d.o.jwt {
		items = list.JWT
	}
	i := slices.IndexFunc(items, func(a api.CAAuthority) bool {
		return a.ID == id || (id == "" && a.State == "active")
	})
	if i < 0 {
		if id == "" {
			return api.CAAuthority{}, list, fmt.Errorf("trust domain %s has no active %s authority: nothing to drill", list.TrustDomain, d.res.Kind)
		}
		return api.CAAuthority{}, list, fmt.Errorf("%s %s is no longer listed by the server", d.what, id)
	}
	return items[i], list, nil
}

// errTimedOut is a wait that outlasted --timeout.
var errTimedOut = errors.New("timed out")

// poll calls check every --poll until it reports done, fails, or
// --timeout passes (errTimedOut).
func (d *drill) poll(ctx context.Context, check func(context.Context) (bool, error)) error {
	deadline := d.e.Now().Add(d.o.timeout)
	t := time.NewTicker(d.o.poll)
	defer t.Stop()
	for {
		done, err := check(ctx)
		if err != nil || done {
			return err
		}
		if !d.e.Now().Before(deadline) {
			return errTimedOut
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
