package bundle

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// Held is one line of bundle list: a trust domain whose bundle the
// server holds.
type Held struct {
	TrustDomain string `json:"trust_domain"`
	// Origin is "local" (our CA), where a federated trust domain is
	// configured (flag, file, crd:NAME, runtime), or the trust store's
	// sources of any other bundle ("static" for bundle set,
	// "file:PATH" for a relayed bundle file).
	Origin         string     `json:"origin"`
	Sequence       *uint64    `json:"sequence"`
	Authorities    int        `json:"authorities"`
	EarliestExpiry *time.Time `json:"earliest_expiry"`
}

func newBundleListCmd(e cli.Env) *cobra.Command {
	var c cli.AdminClient
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List every trust domain whose bundle the running server holds",
		Long: `List the trust domains whose bundle the running server holds (like
spire-server bundle list), from its /v1/snapshot: our own, each federated
peer whose bundle was fetched (or given as its bootstrap bundle), static
bundles set with bundle set and relayed bundle files. For each: its origin
(local; flag, file, crd:NAME or runtime for a federated peer; static; or
file:PATH), the sequence of the bundle held, how many authorities it holds
(X.509 roots and JWT keys; our own revoked ones are not counted) and the
earliest expiry among its X.509 roots. A peer never fetched holds no bundle
and is not listed: see federation status. Needs no token.`,
		Example: `  trustbridge bundle list --data-dir /var/lib/trustbridge
  trustbridge bundle list -o json --admin http://127.0.0.1:15014`,
		Args: cobra.NoArgs,
	}
	out := cli.AddOutputFlag(cmd)
	f := cmd.Flags()
	f.StringVar(&c.Addr, "admin", "http://127.0.0.1:15014", cli.AdminFlagHelp)
	c.AddDataDirFlag(f)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := out.Check(); err != nil {
			return err
		}
		body, err := cli.AdminFrom(cmd, &c).Do(cmd.Context(), http.MethodGet, "/v1/snapshot", nil, false)
		if err != nil {
			return err
		}
		var snap api.Snapshot
		if err := json.Unmarshal([]byte(body), &snap); err != nil {
			return fmt.Errorf("admin answer: %w", err)
		}
		held := heldBundles(snap)
		return out.Print(e.Out, held, heldTable(e.Now(), held))
	}
	return cmd
}

// heldBundles are the snapshot's trust domains that hold authorities,
// the local one first.
func heldBundles(snap api.Snapshot) []Held {
	out := []Held{}
	for _, td := range snap.TrustDomains {
		h := Held{TrustDomain: td.Name, Origin: strings.Join(td.Sources, ","), Sequence: td.Sequence}
		switch {
		case td.Local:
			h.Origin = "local"
		case td.Federation != nil && td.Federation.Origin != "":
			h.Origin = td.Federation.Origin
		}
		for _, a := range td.Authorities {
			if a.State == "revoked" {
				continue
			}
			h.Authorities++
			if a.NotAfter != nil && (h.EarliestExpiry == nil || a.NotAfter.Before(*h.EarliestExpiry)) {
				h.EarliestExpiry = a.NotAfter
			}
		}
		if h.Authorities > 0 {
			out = append(out, h)
		}
	}
	return out
}

func heldTable(now time.Time, held []Held) cli.Table {
	t := cli.Table{
		Columns: []cli.Column{{Name: "Trust domain"}, {Name: "Origin"}, {Name: "Seq"}, {Name: "Authorities"}, {Name: "Earliest expiry"}},
		Empty:   "no bundles held",
	}
	for _, h := range held {
		seq, expiry := "-", "-"
		if h.Sequence != nil {
			seq = fmt.Sprint(*h.Sequence)
		}
		if h.EarliestExpiry != nil {
			expiry = h.EarliestExpiry.UTC().Format(time.RFC3339)
			if now.After(*h.EarliestExpiry) {
				expiry += " (EXPIRED)"
			}
		}
		t.Rows = append(t.Rows, cli.Row{Name: h.TrustDomain, Cells: []any{cli.Printable(h.TrustDomain), cli.Printable(h.Origin), seq, h.Authorities, expiry}})
	}
	return t
}

func newBundleDeleteCmd(e cli.Env) *cobra.Command {
	var c cli.AdminClient
	cmd := &cobra.Command{
		Use:   "delete TRUST_DOMAIN",
		Short: "Delete a static bundle set with bundle set from the running server",
		Long: `Delete the static bundle of TRUST_DOMAIN that bundle set gave the running
server (like spire-server bundle delete): at once, its authorities are no
longer trusted; recorded in the audit log (static_bundle_removed) and kept
across restarts. TRUST_DOMAIN is example.org or spiffe://example.org.

Refused for our own trust domain (its bundle comes from our CA), for a peer
federated by an endpoint (its bundle comes from the endpoint: stop
federating with it with federation remove) and for bundles configured by
flags or files (--federate, --federation-config, --bundle-file: remove them
there). Needs the admin token (<data-dir>/admin.token), or the admin socket
found by default.`,
		Example: `  trustbridge bundle delete static.example --data-dir /var/lib/trustbridge
  trustbridge bundle delete spiffe://static.example`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			td, err := bundledoc.ParseTrustDomain(args[0])
			if err != nil {
				return fmt.Errorf("trust domain %q: %w", args[0], err)
			}
			return cli.AdminFrom(cmd, &c).Relay(cmd.Context(), e.Out, http.MethodDelete, "/v1/bundles/"+url.PathEscape(td.Name()), nil, true)
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.Addr, "admin", "http://127.0.0.1:15014", cli.AdminFlagHelp)
	c.AddAuthFlags(f)
	return cmd
}
