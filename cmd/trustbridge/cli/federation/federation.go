package federation

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

func NewCmd(e cli.Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "federation",
		Short: "See and drive the running server's federation",
		Example: `  trustbridge federation status
  trustbridge federation show west.example
  trustbridge federation refresh west.example`,
	}
	var (
		output      *cli.OutputFlag
		failOnError bool
	)
	status := &cobra.Command{
		Use:   "status",
		Short: "Show every trust domain whose bundle the server holds: state, source, sequence, last success and error",
		Long: `Read the server's /v1/federation and show one line per trust domain whose
bundle the server holds besides its own: each polled endpoint (pending until
its first polls, ok, failing, stale; see docs/operations.md) and each bundle
held as set, state STATIC (bundle set, --bundle-file TD=FILE). SOURCE says
where the bundle comes from: fetched or a bootstrap bundle (and where the
endpoint is configured), set at run time by bundle set, or a bundle file.
-o wide adds the last attempt, profile, endpoint URL and endpoint SPIFFE ID.
-o json prints the server's documents (indented, keys as the server sends
them, including any this version does not know); -o yaml the same as YAML;
-o jsonpath=TEMPLATE reads that JSON document; -o name prints the trust
domains, one a line.

The exit status is 0 when every trust domain is ok, pending or static, 3
when any is failing (a peer that never answered is, after its first polls)
or stale, whatever the output format, after printing it; 1 when the server could not
be asked. --fail-on-error=false exits 0 for failing peers too.`,
		Example: `  trustbridge federation status
  trustbridge federation status -o wide
  trustbridge federation status -o jsonpath='{range .[*]}{.trust_domain}{"\t"}{.state}{"\n"}{end}'
  trustbridge federation status --admin http://127.0.0.1:15014 -o json | jq '.[] | select(.state != "ok")'
  trustbridge federation status --fail-on-error=false -o name`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runFederationStatus(cmd.Context(), e, cli.AdminFrom(cmd, &cli.AdminClient{}), output, failOnError)
		},
	}
	output = cli.AddOutputFlag(status)
	status.Flags().BoolVar(&failOnError, "fail-on-error", true,
		"exit 3 when a federated trust domain is failing, stale or has never answered (false: exit 0 whenever the status was read)")
	refresh := &cobra.Command{
		Use:     "refresh TRUST_DOMAIN",
		Short:   "Poll one trust domain's bundle endpoint now",
		Example: `  trustbridge federation refresh west.example --admin http://127.0.0.1:15014`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			td, err := bundledoc.ParseTrustDomain(args[0])
			if err != nil {
				return fmt.Errorf("trust domain %q: %w", args[0], err)
			}
			path := "/v1/federation/refresh?trust_domain=" + url.QueryEscape(td.Name())
			return cli.AdminFrom(cmd, &cli.AdminClient{}).Relay(cmd.Context(), e.Out, http.MethodPost, path, nil, false)
		},
	}
	cmd.PersistentFlags().String("admin", "http://127.0.0.1:15014", cli.AdminFlagHelp)
	cmd.AddCommand(status, refresh)
	cmd.AddCommand(newFederationManageCmds(e)...)
	return cmd
}

func runFederationStatus(ctx context.Context, e cli.Env, c *cli.AdminClient, output *cli.OutputFlag, failOnError bool) error {
	if err := output.Check(); err != nil {
		return err
	}
	body, err := c.Do(ctx, http.MethodGet, "/v1/federation", nil, false)
	if err != nil {
		return err
	}
	var status []api.FederationStatus
	if err := json.Unmarshal([]byte(body), &status); err != nil {
		return fmt.Errorf("admin answer: %w", err)
	}
	// json, yaml and jsonpath read the server's documents, not their
	// decoding: a newer server's keys pass through.
	if err := output.Print(e.Out, json.RawMessage(body), federationStatusTable(e.Now(), status)); err != nil {
		return err
	}
	if failOnError {
		return unhealthy(status)
	}
	return nil
}

// unhealthy is the exit status 3 error naming the trust domains whose
// bundle is not being refreshed: failing (the last poll failed, or a peer
// that never answered its first polls) or stale (no success for several
// refresh intervals). Pending is a peer still within its first polls.
func unhealthy(status []api.FederationStatus) error {
	var bad []string
	for _, s := range status {
		if s.State == string(federation.StateFailing) || s.State == string(federation.StateStale) {
			bad = append(bad, fmt.Sprintf("%s (%s)", cli.Printable(s.TrustDomain), s.State))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return &cli.ExitError{Code: cli.ExitPeersFailing, Msg: fmt.Sprintf(
		"%d of %d federated trust domains failing or stale: %s; see LAST ERROR above, or pass --fail-on-error=false to exit 0",
		len(bad), len(status), strings.Join(bad, ", "))}
}

func federationStatusTable(now time.Time, status []api.FederationStatus) cli.Table {
	t := cli.Table{
		Columns: []cli.Column{{Name: "Trust domain"}, {Name: "State"}, {Name: "Seq"}, {Name: "Last success"},
			{Name: "Last attempt", Priority: 1}, {Name: "Next"}, {Name: "Failures"}, {Name: "Roots"}, {Name: "Earliest expiry"},
			{Name: "Source"}, {Name: "Profile", Priority: 1}, {Name: "Endpoint URL", Priority: 1}, {Name: "Endpoint SPIFFE ID", Priority: 1},
			{Name: "Last error"}},
		Empty: "no federated trust domains",
	}
	for _, s := range status {
		seq := "-"
		if s.Sequence != nil {
			seq = fmt.Sprint(*s.Sequence)
		}
		roots, earliest := 0, "-"
		var first time.Time
		for _, a := range s.Authorities {
			if a.Kind == api.KindX509 {
				roots++
				if a.NotAfter != nil && (first.IsZero() || a.NotAfter.Before(first)) {
					first = *a.NotAfter
				}
			}
		}
		if !first.IsZero() {
			earliest = first.Format(time.RFC3339)
		}
		t.Rows = append(t.Rows, cli.Row{Name: s.TrustDomain, Cells: []any{
			cli.Printable(s.TrustDomain), strings.ToUpper(s.State), seq, ago(now, s.LastSuccess),
			ago(now, s.LastAttempt), until(now, s.NextRefresh), s.ConsecutiveFailures, roots, earliest,
			cli.Printable(api.SourceLabel(s.Origin, s.Held)), orDash(s.Profile), orDash(cli.Printable(s.EndpointURL)), orDash(cli.Printable(s.EndpointSPIFFEID)),
			cli.Printable(clipText(s.LastError, 80))}})
	}
	return t
}

// ago is when t was, as the CLI and /ui write it ("3d ago"); never when
// it has not happened.
func ago(now time.Time, t *time.Time) string {
	if t == nil {
		return "never"
	}
	return api.Relative(t.Sub(now))
}

// until is when t comes ("in 26m"); due once it has passed.
func until(now time.Time, t *time.Time) string {
	if t == nil {
		return "-"
	}
	if !t.After(now) {
		return "due"
	}
	return api.Relative(t.Sub(now))
}

// clipText cuts s to at most n bytes of whole UTF-8 characters, marked
// with an ellipsis when cut.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
