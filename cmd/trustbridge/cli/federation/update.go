package federation

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

type federationUpdateOptions struct {
	endpointURL string
	endpointID  string
	profile     string
	bundle      string
	noFetch     bool
}

func newFederationUpdateCmd(e cli.Env) *cobra.Command {
	var (
		c cli.AdminClient
		o federationUpdateOptions
	)
	cmd := &cobra.Command{
		Use:   "update TRUST_DOMAIN",
		Short: "Change some fields of a relationship added at run time, keeping the others",
		Long: `Change a relationship added with federation add (like spire-server federation
update), as a patch: only the flags given change; the others, the bootstrap
bundle and the refresh bounds keep their value. --endpoint-spiffe-id makes it
https_spiffe with that ID; --profile https_web makes it https_web (and drops
the ID); --profile https_spiffe alone keeps the ID it has, if any. --bundle
replaces the bootstrap bundle (a SPIFFE bundle document or PEM CA
certificates, as bundle set takes them).

The server checks the result as it checks an added relationship and
fetches it once (refused, with nothing changed, if that fails; --no-fetch
changes it anyway). Applied at once, recorded in the audit log
(federation_updated) and kept across restarts. TRUST_DOMAIN is example.org
or spiffe://example.org.

Trust domains configured by --federate, --federation-config or a
ClusterFederatedTrustDomain of another manager cannot be changed here:
change the flag or the file and restart (or reload), or edit the resource.
Needs the admin token (<data-dir>/admin.token), or the admin socket found by
default.`,
		Example: `  trustbridge federation update east.example --endpoint-url https://east2.example:8443/ --data-dir /var/lib/trustbridge
  trustbridge federation update spiffe://east.example --endpoint-spiffe-id spiffe://east.example/spire/server
  trustbridge federation update east.example --bundle east.example.pem
  trustbridge federation update web.example --profile https_web --no-fetch`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			td, err := bundledoc.ParseTrustDomain(args[0])
			if err != nil {
				return fmt.Errorf("trust domain %q: %w", args[0], err)
			}
			body, err := o.patch(cmd, td)
			if err != nil {
				return err
			}
			path := "/v1/federation/relationships/" + url.PathEscape(td.Name())
			if o.noFetch {
				path += "?no_fetch=true"
			}
			return cli.AdminFrom(cmd, &c).Relay(cmd.Context(), e.Out, http.MethodPatch, path, body, true)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.endpointURL, "endpoint-url", "", "the bundle endpoint's new URL")
	f.StringVar(&o.endpointID, "endpoint-spiffe-id", "", "the endpoint server's SPIFFE ID: makes the relationship https_spiffe with it")
	f.StringVar(&o.profile, "profile", "", "https_web or https_spiffe (https_spiffe needs an endpoint SPIFFE ID, given or kept)")
	f.StringVar(&o.bundle, "bundle", "", "the trust domain's new bootstrap bundle: a SPIFFE bundle document or PEM CA certificates, from its operator over a channel you trust")
	f.BoolVar(&o.noFetch, "no-fetch", false, "change it without fetching it first: a peer that is down now is polled until it answers")
	c.AddAuthFlags(f)
	return cmd
}

// patch is the body of the update: the flags given, and only those.
func (o federationUpdateOptions) patch(cmd *cobra.Command, td spiffeid.TrustDomain) ([]byte, error) {
	var p api.RelationshipPatch
	changed := cmd.Flags().Changed
	if changed("endpoint-url") {
		p.EndpointURL = &o.endpointURL
	}
	if changed("endpoint-spiffe-id") {
		p.EndpointSPIFFEID = &o.endpointID
	}
	if changed("profile") {
		switch federation.Profile(o.profile) {
		case federation.ProfileHTTPSWeb:
			if p.EndpointSPIFFEID != nil {
				return nil, errors.New("--profile https_web authenticates the endpoint by Web PKI, without an endpoint SPIFFE ID: give --profile https_web or --endpoint-spiffe-id, not both")
			}
		case federation.ProfileHTTPSSPIFFE:
		default:
			return nil, fmt.Errorf("--profile %q: want https_web or https_spiffe", o.profile)
		}
		p.Profile = &o.profile
	}
	if changed("bundle") {
		doc, err := cli.ReadSmallFile(o.bundle, bundledoc.DefaultMaxSize)
		if err != nil {
			return nil, fmt.Errorf("--bundle: %w", err)
		}
		// Checked here too, so a wrong file is refused with its name
		// before anything is sent.
		if _, _, err := bundledoc.ParseAny(td, doc); err != nil {
			return nil, fmt.Errorf("--bundle %s: %w", o.bundle, err)
		}
		s := string(doc)
		p.TrustDomainBundle = &s
	}
	if p == (api.RelationshipPatch{}) {
		return nil, errors.New("nothing to update: give at least one of --endpoint-url, --endpoint-spiffe-id, --profile, --bundle")
	}
	return json.Marshal(p)
}
