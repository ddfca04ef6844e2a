package audit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
)

func NewCmd(e cli.Env) *cobra.Command {
	var (
		client cli.AdminClient
		output *cli.OutputFlag
		failOn string
		opts   audit.Options
	)
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Judge what the running server trusts: expiring or weak authorities, stale federation, suspicious refusals",
		Long: `Read the server's /v1/snapshot and report findings with a severity and a fix:

  critical  authority expiring within 7 days or expired; non-CA certificate in a
            bundle; a sequence regression was refused; the same root trusted for
            two trust domains; endpoint not https; a federated peer whose
            endpoint never served a bundle and is failing (nothing of it is
            trusted; see docs/operations.md); an endpoint presented the
            other federation profile's certificate (a client falling back would
            have trusted it);
            JWT authority with an RSA key under 2048 bits or an EC curve below
            P-256; our CA has no active JWT key, or its active JWT key is past
            its not_after, or has an eighth of its life left with no successor;
            with --require-hsm, an active or prepared key of ours outside the
            key manager; with --upstream, our active intermediate expires
            within the default workload TTL, or the upstream has failed for
            over half the intermediate's life
  warning   authority expiring within 30 days; RSA key under 3072 bits; SHA-1
            signature; federation stale (last good bundle still trusted); JWT
            authority of an unknown key type; our active JWT key has a quarter
            of its life left with no successor prepared; with --upstream, our
            active intermediate ends before the longest leaf it may sign, or
            the upstream has failed for longer than
            --upstream-unreachable-fraction of the intermediate's life

The exit status is 2 when a finding at or above --fail-on exists (so it can gate
a CI pipeline), 1 when the audit could not run, 0 otherwise.`,
		Example: `  trustbridge audit
  trustbridge audit --admin http://127.0.0.1:15014 --fail-on warning   # gate a pipeline on warnings too
  trustbridge audit -o json | jq -r '.[] | select(.severity == "critical") | .fix'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := output.Check(); err != nil {
				return err
			}
			if err := audit.CheckOptions(opts); err != nil {
				return fmt.Errorf("--upstream-unreachable-fraction: %w", err)
			}
			var threshold api.Severity
			switch failOn {
			case "warning", "critical":
				threshold = api.Severity(failOn)
			case "none":
			default:
				return fmt.Errorf("--fail-on %q: want warning, critical or none", failOn)
			}
			body, err := cli.AdminFrom(cmd, &client).Do(cmd.Context(), http.MethodGet, "/v1/snapshot", nil, false)
			if err != nil {
				return err
			}
			var snap api.Snapshot
			if err := json.Unmarshal([]byte(body), &snap); err != nil {
				return fmt.Errorf("admin answer is not a snapshot: %w", err)
			}
			findings := audit.FindingsWith(snap, opts)
			if findings == nil {
				findings = []api.Finding{}
			}
			err = output.Print(e.Out, findings, findingsTable(snap, findings))
			if err != nil {
				return err
			}
			if threshold != "" && audit.AtLeast(findings, threshold) {
				return &cli.ExitError{Code: cli.ExitFindings, Msg: fmt.Sprintf("%s: findings at or above %s", countFindings(findings), threshold)}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&client.Addr, "admin", "http://127.0.0.1:15014", cli.AdminFlagHelp)
	output = cli.AddOutputFlag(cmd)
	f.StringVar(&failOn, "fail-on", "critical", "exit 2 when a finding of this severity or worse exists: warning, critical or none")
	f.Float64Var(&opts.UpstreamUnreachableFraction, "upstream-unreachable-fraction", audit.DefaultUpstreamUnreachableFraction,
		"with --upstream: warn when the upstream has failed for longer than this share of the intermediate's life (critical past 0.5)")
	cmd.AddCommand(newAuditLogCmd(e))
	return cmd
}

func countFindings(fs []api.Finding) string {
	var c, w int
	for _, f := range fs {
		if f.Severity == api.SeverityCritical {
			c++
		} else {
			w++
		}
	}
	return fmt.Sprintf("%d critical, %d warning", c, w)
}

// findingsTable is the findings for people: a summary line, then one
// row per finding and a row below it with its fix. Findings have no
// names: -o name refuses.
func findingsTable(snap api.Snapshot, fs []api.Finding) cli.Table {
	var auths int
	for _, td := range snap.TrustDomains {
		auths += len(td.Authorities)
	}
	summary := fmt.Sprintf("trust domain %s (replica %s), %s: %d trust domains, %d authorities; %s",
		snap.TrustDomain, snap.Actor, snap.Time.UTC().Format(time.RFC3339), len(snap.TrustDomains), auths, countFindings(fs))
	t := cli.Table{
		Columns: []cli.Column{{Name: "Severity"}, {Name: "Trust domain"}, {Name: "Code"}, {Name: "Finding"}},
		Before:  summary + "\n",
		Empty:   summary + "\nno findings",
	}
	for _, f := range fs {
		t.Rows = append(t.Rows,
			cli.Row{Cells: []any{strings.ToUpper(string(f.Severity)), cli.Printable(f.TrustDomain), f.Code, cli.Printable(f.Message)}},
			cli.Row{Cells: []any{"", "", "", "fix: " + cli.Printable(f.Fix)}})
	}
	return t
}

func newAuditLogCmd(e cli.Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "log",
		Short:   "Work with the hash-chained audit log (--audit-log)",
		Example: `  trustbridge audit log verify ./data/audit.jsonl`,
	}
	var (
		expectHead string
		output     *cli.OutputFlag
	)
	verify := &cobra.Command{
		Use:   "verify FILE",
		Short: "Check that no entry of an audit log was edited, dropped, inserted or reordered",
		Long: `Check every link of the chain: each entry's hash matches its content and holds
the hash of the entry before it. Prints the number of entries and the head (the
hash of the last entry). A chain cannot show that its newest entries were cut
off: compare the head with one kept elsewhere (the server logs it with every
entry), or pass it as --expect-head. "-" reads standard input.

The exit status is 0 when the chain verifies, 3 when it verifies up to a torn
final line (bytes without a newline, as a crash or a full disk in the middle of
a write leaves; the server moves them into FILE.torn-after-<seq>-<hash> at its
next start and records a log_recovered entry), 1 when it does not verify (an entry edited, dropped,
inserted or reordered: keep the file as evidence).`,
		Example: `  trustbridge audit log verify ./data/audit.jsonl
  trustbridge audit log verify --expect-head "$(cat head.txt)" ./data/audit.jsonl
  cat ./data/audit.jsonl | trustbridge audit log verify -o json -`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := output.Check(); err != nil {
				return err
			}
			var r io.Reader = e.In
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
			}
			res, err := audit.Verify(r)
			torn := errors.Is(err, audit.ErrTornTail)
			if err != nil && !torn {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			// With a torn tail, the head checked is that of the entries
			// before it: what the server continues from.
			if expectHead != "" && !strings.EqualFold(expectHead, res.Head) {
				return fmt.Errorf("%s: %w: head is %s, expected %s: entries after the expected head were cut off or replaced",
					args[0], audit.ErrBroken, res.Head, expectHead)
			}
			if err := output.Write(e.Out, res, func(w io.Writer) error { return printVerified(w, args[0], res) }); err != nil {
				return err
			}
			if torn {
				return &cli.ExitError{Code: cli.ExitTornTail, Msg: fmt.Sprintf(
					"%s: torn tail: %d bytes (sha256 %s) after the last entry end without a newline: a write cut short by a crash or a full disk, not an edit of any entry above; the server moves them into %s%s<seq>-<hash> at its next start and records a log_recovered entry",
					args[0], res.TornBytes, audit.ShortHash(res.TornSHA256), args[0], audit.TornTailSuffix)}
			}
			return nil
		},
	}
	verify.Flags().StringVar(&expectHead, "expect-head", "", "fail unless the last entry's hash is this one (detects a cut-off tail)")
	output = cli.AddOutputFlag(verify)
	cmd.AddCommand(verify)
	return cmd
}

// printVerified reports the part of a chain that verifies.
func printVerified(w io.Writer, name string, res audit.VerifyResult) error {
	if res.Entries == 0 && res.TornBytes == 0 {
		_, err := fmt.Fprintf(w, "%s: empty, nothing to verify\n", name)
		return err
	}
	if res.Entries == 0 {
		_, err := fmt.Fprintf(w, "%s: no whole entry\n", name)
		return err
	}
	_, err := fmt.Fprintf(w, "%s: ok, %d entries from %s to %s\nhead %s\n", name, res.Entries,
		res.First.UTC().Format(time.RFC3339), res.Last.UTC().Format(time.RFC3339), res.Head)
	return err
}
