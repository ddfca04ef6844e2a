package federation

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
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
	var output *cli.OutputFlag
	status := &cobra.Command{
		Use:   "status",
		Short: "Show every trust domain whose bundle the server holds: state, source, sequence, last success and error",
		Long: `Read the server's /v1/federation and show one line per trust domain whose
bundle the server holds besides its own: each polled endpoint (pending until
its first polls, ok, failing, stale; see docs/operations.md) and each bundle
held as set, state STATIC (bundle set, --bundle-file TD=FILE). SOURCE says
where the bundle comes from: fetched or a bootstrap bundle (and where the
endpoint is configured), set at run time by bundle set, or a bundle file.
-o json prints the server's documents (indented, keys as the server sends
them, including any this version does not know); -o yaml the same as YAML.`,
		Example: `  trustbridge federation status
  trustbridge federation status --admin http://127.0.0.1:15014 -o json | jq '.[] | select(.state != "ok")'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runFederationStatus(cmd.Context(), e, cli.AdminFrom(cmd, &cli.AdminClient{}), output)
		},
	}
	output = cli.AddOutputFlag(status)
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

func runFederationStatus(ctx context.Context, e cli.Env, c *cli.AdminClient, output *cli.OutputFlag) error {
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
	// json and yaml are the server's documents, not their decoding: a
	// newer server's keys pass through.
	return output.Write(e.Out, json.RawMessage(body), func(w io.Writer) error {
		return printFederationStatus(w, e.Now(), status)
	})
}

func printFederationStatus(w io.Writer, now time.Time, status []api.FederationStatus) error {
	if len(status) == 0 {
		_, err := fmt.Fprintln(w, "no federated trust domains")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TRUST DOMAIN\tSTATE\tSEQ\tLAST SUCCESS\tNEXT\tFAILURES\tROOTS\tEARLIEST EXPIRY\tSOURCE\tLAST ERROR")
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", s.TrustDomain, strings.ToUpper(string(s.State)), seq,
			ago(now, s.LastSuccess), until(now, s.NextRefresh), s.ConsecutiveFailures, roots, earliest,
			cli.Printable(api.SourceLabel(s.Origin, s.Held)), cli.Printable(clipText(s.LastError, 80)))
	}
	return tw.Flush()
}

func ago(now time.Time, t *time.Time) string {
	if t == nil {
		return "never"
	}
	return now.Sub(*t).Truncate(time.Second).String() + " ago"
}

func until(now time.Time, t *time.Time) string {
	if t == nil {
		return "-"
	}
	d := t.Sub(now).Truncate(time.Second)
	if d < 0 {
		return "due"
	}
	return "in " + d.String()
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
