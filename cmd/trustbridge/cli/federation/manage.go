package federation

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/spf13/cobra"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// newFederationManageCmds are federation add, remove and list.
func newFederationManageCmds(e cli.Env) []*cobra.Command {
	return []*cobra.Command{newFederationAddCmd(e), newFederationRemoveCmd(e), newFederationListCmd(e)}
}

type federationAddOptions struct {
	endpointID string
	bundle     string
	force      bool
	noFetch    bool
}

func newFederationAddCmd(e cli.Env) *cobra.Command {
	var (
		c cli.AdminClient
		o federationAddOptions
	)
	cmd := &cobra.Command{
		Use:   "add TRUST_DOMAIN URL",
		Short: "Federate with a trust domain's bundle endpoint now, without a restart",
		Long: `Add a federation relationship to the running server (like spire-server
federation create): https_web, or https_spiffe with --endpoint-spiffe-id.
The server checks it as it checks --federation-config (a self-serving
https_spiffe endpoint needs --bundle, its trust domain's bundle from its
operator, unless a bundle of it is held or set with bundle set), fetches it
once (refused, with nothing changed, if that fails; --no-fetch adds it
anyway), starts polling it, records it in the audit log and keeps it in
<data-dir>/federation-managed.yaml (the --federation-config schema) across
restarts. Trust domains configured by --federate or --federation-config are
changed there, not here. Needs the admin token: the server writes it at each
start to <data-dir>/admin.token (mode 0600).

With --storage kube, federate with ClusterFederatedTrustDomain resources
instead (--federation-crd).`,
		Example: `  # an https_web peer
  trustbridge federation add web.example https://web.example/bundle --data-dir /var/lib/trustbridge
  # an https_spiffe peer with its bundle (SPIFFE bundle or PEM roots) from its operator
  trustbridge federation add east.example https://east.example:8443/ \
    --endpoint-spiffe-id spiffe://east.example/trustbridge/bundle-endpoint --bundle east.example.pem
  # change its URL
  trustbridge federation add east.example https://east2.example:8443/ \
    --endpoint-spiffe-id spiffe://east.example/trustbridge/bundle-endpoint --force`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			body, err := addBody(args[0], args[1], o)
			if err != nil {
				return err
			}
			return cli.AdminFrom(cmd, &c).Relay(cmd.Context(), e.Out, http.MethodPost, o.path(), body, true)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.endpointID, "endpoint-spiffe-id", "", "the endpoint server's SPIFFE ID: makes the relationship https_spiffe (without it, https_web)")
	f.StringVar(&o.bundle, "bundle", "", "the trust domain's bundle for the first https_spiffe fetch: a SPIFFE bundle document or PEM CA certificates, from its operator over a channel you trust")
	f.BoolVar(&o.force, "force", false, "replace the trust domain's relationship if one was added at run time (without --bundle it keeps its bootstrap bundle)")
	f.BoolVar(&o.noFetch, "no-fetch", false, "add it without fetching it first: a peer that is down now is polled until it answers")
	c.AddAuthFlags(f)
	return cmd
}

// path is federation add's admin path, its flags as the query.
func (o federationAddOptions) path() string {
	q := url.Values{}
	if o.force {
		q.Set("force", "true")
	}
	if o.noFetch {
		q.Set("no_fetch", "true")
	}
	path := "/v1/federation/relationships"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	return path
}

// addBody is the entry federation add sends: one item in the
// --federation-config schema, so the server parses it as it parses files.
func addBody(td, endpoint string, o federationAddOptions) ([]byte, error) {
	profile := map[string]string{"type": string(federation.ProfileHTTPSWeb)}
	if o.endpointID != "" {
		profile = map[string]string{"type": string(federation.ProfileHTTPSSPIFFE), "endpointSPIFFEID": o.endpointID}
	}
	item := map[string]any{"trustDomain": td, "bundleEndpointURL": endpoint, "bundleEndpointProfile": profile}
	if o.bundle != "" {
		doc, err := cli.ReadSmallFile(o.bundle, bundledoc.DefaultMaxSize)
		if err != nil {
			return nil, fmt.Errorf("--bundle: %w", err)
		}
		item["trustDomainBundle"] = string(doc)
	}
	return json.Marshal(map[string]any{"federation": []any{item}})
}

func newFederationRemoveCmd(e cli.Env) *cobra.Command {
	var c cli.AdminClient
	cmd := &cobra.Command{
		Use:   "remove TRUST_DOMAIN",
		Short: "Stop federating with a trust domain added at run time",
		Long: `Remove a relationship added with federation add (or a static bundle set with
bundle set), at once: the trust domain is polled no more and its bundle is no
longer trusted. Recorded in the audit log. Trust domains configured by
--federate or --federation-config are removed there, with a restart.`,
		Example: `  trustbridge federation remove east.example --data-dir /var/lib/trustbridge`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			td, err := bundledoc.TrustDomainName(args[0])
			if err != nil {
				return fmt.Errorf("trust domain %q: %w", args[0], err)
			}
			return cli.AdminFrom(cmd, &c).Relay(cmd.Context(), e.Out, http.MethodDelete, "/v1/federation/relationships/"+url.PathEscape(td.Name()), nil, true)
		},
	}
	c.AddAuthFlags(cmd.Flags())
	return cmd
}

func newFederationListCmd(e cli.Env) *cobra.Command {
	var c cli.AdminClient
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List every federated trust domain: endpoint, profile, origin",
		Long: `List the running server's federated trust domains with their endpoint URL,
profile, endpoint SPIFFE ID, polling state and origin: flag (--federate),
file (--federation-config), crd:NAME (a ClusterFederatedTrustDomain),
runtime (federation add) or static (bundle set, no endpoint). Needs no token.`,
		Example: `  trustbridge federation list
  trustbridge federation list -o json`,
		Args: cobra.NoArgs,
	}
	out := cli.AddOutputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := out.Check(); err != nil {
			return err
		}
		body, err := cli.AdminFrom(cmd, &c).Do(cmd.Context(), http.MethodGet, "/v1/federation/relationships", nil, false)
		if err != nil {
			return err
		}
		var rels []api.Relationship
		if err := json.Unmarshal([]byte(body), &rels); err != nil {
			return fmt.Errorf("admin answer: %w", err)
		}
		return out.Print(e.Out, rels, relationshipsTable(rels))
	}
	return cmd
}

func relationshipsTable(rels []api.Relationship) cli.Table {
	t := cli.Table{
		Columns: []cli.Column{{Name: "Trust domain"}, {Name: "Origin"}, {Name: "Profile"}, {Name: "State"},
			{Name: "Endpoint URL"}, {Name: "Endpoint SPIFFE ID"}},
		Empty: "no federated trust domains",
	}
	for _, r := range rels {
		t.Rows = append(t.Rows, cli.Row{Name: r.TrustDomain, Cells: []any{cli.Printable(r.TrustDomain), orDash(r.Origin),
			orDash(r.Profile), orDash(strings.ToUpper(r.State)), orDash(cli.Printable(r.EndpointURL)), orDash(cli.Printable(r.EndpointSPIFFEID))}})
	}
	return t
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
