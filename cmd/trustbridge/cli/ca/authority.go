package ca

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

const authorityLong = `Change the running server's signing authorities on an operator's word: the
incident-response path for a CA key suspected of compromise (SPIRE's
localauthority and upstreamauthority commands). The X.509 authorities
(--x509) are the roots or, in upstream mode, the intermediates the upstream
signed; the JWT authorities (--jwt) the JWT-SVID signing keys. Every change
goes to the leader, needs the admin token (or the admin socket), is refused
with what to do where it would break the trust domain, and is recorded in
the audit log with who asked.

The sequence, for a compromised X.509 authority (the same with --jwt):

  1. prepare: a successor, published in the bundle at once. Peers learn it
     at their next fetch of our bundle; it signs nothing yet.
  2. activate --now: the successor signs every new certificate from now,
     without waiting the usual 5 refresh hints after publication. Peers
     that have not fetched our bundle since it was published refuse what
     it signs until they do: activate names those it knows of.
  3. taint ID: the compromised authority signs nothing more, and clients
     re-issue what it signed at once: the node agent, trustbridge agent,
     the Workload API and SDS (jittered, so they do not all come at once).
     Istio's own clients (istio-agent, ztunnel) pick up a re-issue only at
     their next renewal: until then they keep what it signed.
  4. wait until ca authority list shows nothing of it in use (SIGNED, the
     second number: leaves workloads still present).
  5. revoke ID: it leaves the bundle (the sequence moves), the bundle names
     it as revoked, and peers that fetch it stop trusting it at once and
     refuse a bundle that brings it back. Refused while workloads still
     present what it signed, unless --force: they then fail until they
     re-issue.

Only a tainted authority that no longer signs, or a prepared one that never
did, can be revoked; the active one cannot be tainted or revoked.

Drill: trustbridge ca drill runs the whole sequence against the running
server, for real, waits for the re-issue and for the peers' fetch of the
revocation, and prints the timeline. Run it on a lab setup to learn how
long your estate takes to move, or in an incident as the scripted response:

  trustbridge ca drill --x509 --yes --admin http://127.0.0.1:15014`

// newAuthorityCmd is trustbridge ca authority: list, prepare, activate,
// taint and revoke the running server's signing authorities.
func newAuthorityCmd(e cli.Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "authority",
		Short: "List, prepare, activate, taint and revoke the running server's signing authorities",
		Long:  authorityLong,
		Example: `  trustbridge ca authority list
  trustbridge ca authority prepare --x509
  trustbridge ca authority activate --x509 --now
  trustbridge ca authority taint --x509 5f3a9c01
  trustbridge ca authority list --x509
  trustbridge ca authority revoke --x509 5f3a9c01`,
	}
	cmd.PersistentFlags().String("admin", "http://127.0.0.1:15014", cli.AdminFlagHelp)
	cmd.AddCommand(newAuthorityListCmd(e))
	for _, a := range authorityActions {
		cmd.AddCommand(newAuthorityChangeCmd(e, a))
	}
	return cmd
}

func newAuthorityListCmd(e cli.Env) *cobra.Command {
	var (
		c         cli.AdminClient
		jwt, x509 bool
	)
	cmd := &cobra.Command{
		Use:   "list [--x509|--jwt]",
		Short: "List the signing authorities: state, taint, and what each signed that is still valid",
		Long: `List the running server's X.509 authorities (roots, or upstream-signed
intermediates) and JWT signing keys with their state, when they were
tainted, and, where the server counts them, what each signed that is still
valid: LIVE (not expired) / IN USE (not superseded by a newer one for the
same workload). The counts run since the replica asked started. Needs no
token.`,
		Example: `  trustbridge ca authority list
  trustbridge ca authority list --jwt -o json`,
		Args: cobra.NoArgs,
	}
	out := cli.AddOutputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := out.Check(); err != nil {
			return err
		}
		if jwt && x509 {
			return errors.New("--x509 and --jwt: give at most one")
		}
		list, err := listAuthorities(cmd.Context(), cli.AdminFrom(cmd, &c))
		if err != nil {
			return err
		}
		if jwt {
			list.X509 = nil
		}
		if x509 {
			list.JWT = nil
		}
		return out.Print(e.Out, list, authoritiesTable(list))
	}
	cmd.Flags().BoolVar(&x509, "x509", false, "only the X.509 authorities")
	cmd.Flags().BoolVar(&jwt, "jwt", false, "only the JWT signing keys")
	return cmd
}

// authoritiesTable is list for people, times in UTC, with the trust
// domain, sequence and what the signed counts cover below it.
func authoritiesTable(list api.CAAuthorities) cli.Table {
	t := cli.Table{Columns: []cli.Column{{Name: "ID"}, {Name: "Kind"}, {Name: "State"}, {Name: "Tainted"},
		{Name: "Signed live/in use"}, {Name: "Not after"}}}
	var partial []string
	for _, a := range append(list.X509, list.JWT...) {
		signed := "-"
		if a.Signed != nil {
			signed = fmt.Sprintf("%d/%d", a.Signed.Live, a.Signed.InUse)
			if a.Signed.Incomplete != "" {
				signed += "+?"
				partial = append(partial, fmt.Sprintf("+? %s: %s", cli.Printable(a.ID), cli.Printable(a.Signed.Incomplete)))
			}
		}
		t.Rows = append(t.Rows, cli.Row{Name: a.ID, Cells: []any{cli.Printable(a.ID), a.Kind, strings.ToUpper(a.State),
			optStamp(a.TaintedAt), signed, optStamp(a.NotAfter)}})
	}
	note := "signed: not counted by this server"
	if list.SignedSince != nil {
		note = "signed: counted since " + optStamp(list.SignedSince) + " (the replica's start)"
	}
	t.After = strings.Join(append([]string{fmt.Sprintf("\ntrust domain %s, bundle sequence %d; %s", list.TrustDomain, list.Sequence, note)}, partial...), "\n") + "\n"
	t.Empty = "no authorities" + strings.TrimSuffix(t.After, "\n")
	return t
}

func optStamp(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// authorityAction is one change of ca authority.
type authorityAction struct {
	name, use, short, long, example string
	// id: the ID argument is required (1), optional (0) or refused (-1).
	id int
}

var authorityActions = []authorityAction{
	{name: "prepare", use: "prepare --x509|--jwt", id: -1,
		short: "Publish a successor authority now; it signs after 5 refresh hints, or with activate --now",
		long: `Prepare a successor X.509 authority (--x509; in upstream mode the upstream
signs a new intermediate now) or JWT signing key (--jwt) and publish it in
the bundle at once, so that peers fetch it before it signs. When one is
prepared already, it is kept and named: nothing changes.`,
		example: `  trustbridge ca authority prepare --x509
  trustbridge ca authority prepare --jwt`},
	{name: "activate", use: "activate --x509|--jwt [ID] [--now]", id: 0,
		short: "Make the prepared authority the one that signs",
		long: `Make the prepared authority (ID, or the one prepared) sign every new
certificate or JWT-SVID; the one it replaces retires and stays published
until what it signed expires. Without --now this is refused before 5 refresh
hints have passed since it was published (it activates on its own then).
--now skips the wait: the answer names the peers whose last fetch of our
bundle predates it (or says fetches are not tracked); they refuse what it
signs until their next fetch.`,
		example: `  trustbridge ca authority activate --x509 --now
  trustbridge ca authority activate --jwt 2kq0sXcE...`},
	{name: "taint", use: "taint --x509|--jwt ID", id: 1,
		short: "Mark an authority compromised: clients re-issue what it signed, at once",
		long: `Taint a retired authority: it signs nothing more, the certificate service
refuses it, and every trustbridge client (node agent, trustbridge agent,
Workload API, SDS) re-issues what it signed at once, jittered over a short
window. Istio's own clients pick up a re-issue only at their next renewal.
The active authority cannot be tainted: prepare and activate a successor
first. It stays trusted until revoked.`,
		example: `  trustbridge ca authority taint --x509 5f3a9c01`},
	{name: "revoke", use: "revoke --x509|--jwt ID [--force]", id: 1,
		short: "Remove a tainted authority from the bundle: peers stop trusting it",
		long: `Revoke a tainted authority (or a prepared one that never signed): it leaves
the bundle, the bundle names it as revoked until it expires, and peers that
fetch the bundle stop trusting it and refuse one that brings it back.
Refused while workloads still present what it signed (ca authority list,
IN USE): wait for them to re-issue, or give --force, and they fail until
they do.`,
		example: `  trustbridge ca authority revoke --x509 5f3a9c01
  trustbridge ca authority revoke --jwt 2kq0sXcE... --force`},
}

func newAuthorityChangeCmd(e cli.Env, a authorityAction) *cobra.Command {
	var (
		c   cli.AdminClient
		req = api.CAAuthorityChange{Action: a.name}
		x   bool
	)
	args := cobra.ExactArgs(1)
	switch a.id {
	case 0:
		args = cobra.MaximumNArgs(1)
	case -1:
		args = cobra.NoArgs
	}
	cmd := &cobra.Command{
		Use: a.use, Short: a.short, Long: a.long + "\n\nSee trustbridge ca authority --help for the whole sequence.",
		Example: a.example, Args: args,
		RunE: func(cmd *cobra.Command, args []string) error {
			if x == req.JWT {
				return errors.New("give exactly one of --x509 and --jwt")
			}
			if len(args) == 1 {
				req.ID = args[0]
			}
			return changeAuthority(cmd, e, &c, req)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&x, "x509", false, "an X.509 authority: a root, or in upstream mode an intermediate")
	f.BoolVar(&req.JWT, "jwt", false, "a JWT-SVID signing key")
	switch a.name {
	case "activate":
		f.BoolVar(&req.Now, "now", false, "sign at once, without waiting 5 refresh hints after publication")
	case "revoke":
		f.BoolVar(&req.Force, "force", false, "revoke although workloads still present what it signed: they fail until they re-issue")
	}
	c.AddAuthFlags(f)
	return cmd
}

// changeAuthority sends req and prints the server's answer: its message,
// then its warnings.
func changeAuthority(cmd *cobra.Command, e cli.Env, c *cli.AdminClient, req api.CAAuthorityChange) error {
	res, err := postAuthorityChange(cmd.Context(), cli.AdminFrom(cmd, c), req)
	if err != nil {
		return err
	}
	fmt.Fprintln(e.Out, res.Message)
	for _, w := range res.Warnings {
		fmt.Fprintln(e.Out, "warning:", w)
	}
	return nil
}

// postAuthorityChange sends req to POST /v1/ca/authorities, with the
// admin token, and returns the server's answer.
func postAuthorityChange(ctx context.Context, c *cli.AdminClient, req api.CAAuthorityChange) (api.CAAuthorityResult, error) {
	var res api.CAAuthorityResult
	body, err := json.Marshal(req)
	if err != nil {
		return res, err
	}
	out, err := c.Do(ctx, http.MethodPost, "/v1/ca/authorities", body, true)
	if err != nil {
		return res, err
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		return res, fmt.Errorf("admin answer: %w", err)
	}
	return res, nil
}

// listAuthorities is GET /v1/ca/authorities, which needs no token.
func listAuthorities(ctx context.Context, c *cli.AdminClient) (api.CAAuthorities, error) {
	var list api.CAAuthorities
	return list, getJSON(ctx, c, "/v1/ca/authorities", &list)
}

// getJSON reads the admin API's answer to GET path into v.
func getJSON(ctx context.Context, c *cli.AdminClient, path string, v any) error {
	body, err := c.Do(ctx, http.MethodGet, path, nil, false)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		return fmt.Errorf("admin answer to %s: %w", path, err)
	}
	return nil
}
