package federation

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// newFederationManageCmds are federation add, update, remove, list and
// show.
func newFederationManageCmds(e cli.Env) []*cobra.Command {
	return []*cobra.Command{newFederationAddCmd(e), newFederationUpdateCmd(e), newFederationRemoveCmd(e), newFederationListCmd(e), newFederationShowCmd(e)}
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
changed there, not here. TRUST_DOMAIN is example.org or spiffe://example.org.
Needs the admin token (the server writes it at each start to
<data-dir>/admin.token, mode 0600), or the admin socket found by default.

--force replaces a relationship added at run time, all of it (without
--bundle it keeps its bootstrap bundle), like spire-server federation
create over an existing one; it refuses to turn an https_spiffe peer into
https_web because --endpoint-spiffe-id was left out. To change some fields
and keep the others, use federation update.

With --storage kube, federate with ClusterFederatedTrustDomain resources
instead (--federation-crd).`,
		Example: `  # an https_web peer
  trustbridge federation add web.example https://web.example/bundle --data-dir /var/lib/trustbridge
  # an https_spiffe peer with its bundle (SPIFFE bundle or PEM roots) from its operator
  trustbridge federation add east.example https://east.example:8443/ \
    --endpoint-spiffe-id spiffe://east.example/trustbridge/bundle-endpoint --bundle east.example.pem
  # replace it whole
  trustbridge federation add spiffe://east.example https://east2.example:8443/ \
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
	f.BoolVar(&o.force, "force", false, "replace the trust domain's relationship if one was added at run time (without --bundle it keeps its bootstrap bundle; https_spiffe stays so unless --endpoint-spiffe-id is given: see federation update)")
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
func addBody(name, endpoint string, o federationAddOptions) ([]byte, error) {
	td, err := bundledoc.ParseTrustDomain(name)
	if err != nil {
		return nil, fmt.Errorf("trust domain %q: %w", name, err)
	}
	profile := map[string]string{"type": string(federation.ProfileHTTPSWeb)}
	if o.endpointID != "" {
		profile = map[string]string{"type": string(federation.ProfileHTTPSSPIFFE), "endpointSPIFFEID": o.endpointID}
	}
	item := map[string]any{"trustDomain": td.Name(), "bundleEndpointURL": endpoint, "bundleEndpointProfile": profile}
	if o.bundle != "" {
		doc, err := cli.ReadSmallFile(o.bundle, bundledoc.DefaultMaxSize)
		if err != nil {
			return nil, fmt.Errorf("--bundle: %w", err)
		}
		if err := checkBundle(td.Name(), o.endpointID, doc); err != nil {
			return nil, fmt.Errorf("--bundle %s: %w; give %s's bundle as its operator prints it with trustbridge bundle show -o spiffe (or -o pem)", o.bundle, err, td.Name())
		}
		item["trustDomainBundle"] = string(doc)
	}
	return json.Marshal(map[string]any{"federation": []any{item}})
}

// checkBundle checks --bundle here, so that a refusal names the flag and
// the file rather than the request's entry the server parses.
func checkBundle(td, endpointID string, doc []byte) error {
	ep, ok := bundleEndpoint(td, endpointID)
	if !ok {
		return nil
	}
	_, err := ep.SetBootstrapBundle(doc)
	return err
}

// bundleEndpoint is the endpoint federation add describes, for checking
// its bundle; false when an argument does not parse, which the server
// refuses saying what is wrong.
func bundleEndpoint(td, endpointID string) (federation.Endpoint, bool) {
	ep := federation.Endpoint{Profile: federation.ProfileHTTPSWeb}
	var err error
	if ep.TrustDomain, err = bundledoc.TrustDomainName(td); err != nil {
		return ep, false
	}
	if endpointID != "" {
		if ep.EndpointSPIFFEID, err = spiffeid.FromString(endpointID); err != nil {
			return ep, false
		}
		ep.Profile = federation.ProfileHTTPSSPIFFE
	}
	return ep, true
}

func newFederationRemoveCmd(e cli.Env) *cobra.Command {
	var c cli.AdminClient
	cmd := &cobra.Command{
		Use:   "remove TRUST_DOMAIN",
		Short: "Stop federating with a trust domain added at run time",
		Long: `Remove a relationship added with federation add (or a static bundle set with
bundle set), at once: the trust domain is polled no more and its bundle is no
longer trusted. Recorded in the audit log. Trust domains configured by
--federate or --federation-config are removed there, with a restart.
TRUST_DOMAIN is example.org or spiffe://example.org.`,
		Example: `  trustbridge federation remove east.example --data-dir /var/lib/trustbridge`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			td, err := bundledoc.ParseTrustDomain(args[0])
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
