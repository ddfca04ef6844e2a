package federation

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// Peer is what federation show prints of one federated trust domain:
// its polling state (GET /v1/federation) and where it is configured
// (GET /v1/federation/relationships).
type Peer struct {
	api.FederationStatus
	Origin string `json:"origin"`
}

func newFederationShowCmd(e cli.Env) *cobra.Command {
	var c cli.AdminClient
	cmd := &cobra.Command{
		Use:   "show TRUST_DOMAIN",
		Short: "Show one federated trust domain in full: endpoint, profile, origin, state, authorities",
		Long: `Show one federated trust domain (like spire-server federation show): its
bundle endpoint URL, profile and endpoint SPIFFE ID, where it is configured
(flag, file, crd:NAME, runtime), its polling state, the sequence and
refresh hint of the bundle held, the last success and error, and each
authority of that bundle with its expiry. TRUST_DOMAIN is example.org or
spiffe://example.org. A trust domain trusted by a static bundle (bundle set)
has no endpoint to show: see bundle list. Needs no token.`,
		Example: `  trustbridge federation show east.example
  trustbridge federation show spiffe://east.example -o json --admin http://127.0.0.1:15014`,
		Args: cobra.ExactArgs(1),
	}
	out := cli.AddOutputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := out.Check(); err != nil {
			return err
		}
		td, err := bundledoc.ParseTrustDomain(args[0])
		if err != nil {
			return fmt.Errorf("trust domain %q: %w", args[0], err)
		}
		peer, err := fetchPeer(cmd.Context(), cli.AdminFrom(cmd, &c), td)
		if err != nil {
			return err
		}
		return out.Write(e.Out, peer, func(w io.Writer) error { return printPeer(w, e.Now(), peer) })
	}
	return cmd
}

// fetchPeer reads td's status and origin, or says why there is none.
func fetchPeer(ctx context.Context, c *cli.AdminClient, td spiffeid.TrustDomain) (Peer, error) {
	var (
		status []api.FederationStatus
		rels   []api.Relationship
	)
	for _, get := range []struct {
		path string
		v    any
	}{{"/v1/federation", &status}, {"/v1/federation/relationships", &rels}} {
		body, err := c.Do(ctx, http.MethodGet, get.path, nil, false)
		if err != nil {
			return Peer{}, err
		}
		if err := json.Unmarshal([]byte(body), get.v); err != nil {
			return Peer{}, fmt.Errorf("admin answer: %w", err)
		}
	}
	i := slices.IndexFunc(status, func(s api.FederationStatus) bool { return s.TrustDomain == td.Name() })
	if i < 0 {
		if slices.ContainsFunc(rels, func(r api.Relationship) bool { return r.TrustDomain == td.Name() && r.Origin == api.OriginStatic }) {
			return Peer{}, fmt.Errorf("%s is trusted by a static bundle (bundle set), without an endpoint to show: see trustbridge bundle list", td.Name())
		}
		return Peer{}, fmt.Errorf("%s is not federated (see trustbridge federation list)", td.Name())
	}
	peer := Peer{FederationStatus: status[i]}
	if j := slices.IndexFunc(rels, func(r api.Relationship) bool { return r.TrustDomain == td.Name() }); j >= 0 {
		peer.Origin = rels[j].Origin
	}
	return peer, nil
}

func printPeer(w io.Writer, now time.Time, p Peer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	seq, hint := "-", "(not set)"
	if p.Sequence != nil {
		seq = fmt.Sprint(*p.Sequence)
	}
	if p.RefreshHintSeconds != nil {
		hint = fmt.Sprintf("%ds (%s)", *p.RefreshHintSeconds, time.Duration(*p.RefreshHintSeconds)*time.Second)
	}
	for _, row := range [][2]string{
		{"Trust domain", p.TrustDomain},
		{"Origin", orDash(p.Origin)},
		{"Endpoint URL", cli.Printable(p.EndpointURL)},
		{"Profile", p.Profile},
		{"Endpoint SPIFFE ID", orDash(p.EndpointSPIFFEID)},
		{"State", strings.ToUpper(p.State)},
		{"Sequence", seq},
		{"Refresh hint", hint},
		{"Last attempt", stamp(now, p.LastAttempt)},
		{"Last success", stamp(now, p.LastSuccess)},
		{"Next refresh", until(now, p.NextRefresh)},
		{"Failures in a row", fmt.Sprint(p.ConsecutiveFailures)},
		{"Last error", orDash(cli.Printable(p.LastError))},
		{"Refusals", refusals(p.Refusals)},
		{"Authorities", fmt.Sprint(len(p.Authorities))},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", row[0], row[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(p.Authorities) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tSUBJECT / KEY ID\tNOT AFTER\tSHA-256")
	for _, a := range p.Authorities {
		name := a.Subject
		if a.KeyID != "" {
			name = "kid " + a.KeyID
		}
		notAfter := "-"
		if a.NotAfter != nil {
			notAfter = a.NotAfter.UTC().Format(time.RFC3339)
			if now.After(*a.NotAfter) {
				notAfter += " (EXPIRED)"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", a.Kind, cli.Printable(name), notAfter, a.SHA256)
	}
	return tw.Flush()
}

// stamp is t as RFC 3339 with how long ago, "never" when unset.
func stamp(now time.Time, t *time.Time) string {
	if t == nil {
		return "never"
	}
	return t.UTC().Format(time.RFC3339) + " (" + ago(now, t) + ")"
}

func refusals(m map[string]uint64) string {
	if len(m) == 0 {
		return "none"
	}
	kinds := make([]string, 0, len(m))
	for k := range m {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for i, k := range kinds {
		kinds[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(kinds, ", ")
}
