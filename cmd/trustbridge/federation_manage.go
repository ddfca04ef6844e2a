package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/admin"
)

// adminTokenEnv names the admin token file when --admin-token-file is not
// given.
const AdminTokenEnv = "TRUSTBRIDGE_ADMIN_TOKEN_FILE"

// adminFlagHelp describes --admin wherever a command talks to the admin API.
const AdminFlagHelp = "the server's admin address: http://HOST:PORT, or unix://PATH of its --admin-socket (no token needed there)"

// adminClient talks to a running server's admin API; mutations bear the
// token the server wrote into its data directory.
type AdminClient struct {
	Addr      string
	DataDir   string
	TokenFile string
}

// addAuthFlags registers where the admin token is.
func (c *AdminClient) AddAuthFlags(f *pflag.FlagSet) {
	f.StringVar(&c.DataDir, "data-dir", "./data", "the server's --data-dir, where it writes its admin token ("+server.AdminTokenName+", mode 0600, new at each start)")
	f.StringVar(&c.TokenFile, "admin-token-file", "", "file holding the admin token (default <data-dir>/"+server.AdminTokenName+"; env "+AdminTokenEnv+")")
}

// token reads the admin token: --admin-token-file, else the environment,
// else the data directory's.
func (c *AdminClient) Token() (string, error) {
	path := c.TokenFile
	if path == "" {
		path = os.Getenv(AdminTokenEnv)
	}
	if path == "" {
		path = filepath.Join(c.DataDir, server.AdminTokenName)
	}
	data, err := ReadSmallFile(path, 4<<10)
	if err != nil {
		return "", fmt.Errorf("admin token: %w; run this as the server's user on its host with the server's --data-dir (or --admin-token-file): the server writes the token there at each start", err)
	}
	return strings.TrimSpace(string(data)), nil
}

// do sends one request; auth adds the token. A non-2xx answer is an error
// carrying the server's message.
func (c *AdminClient) Do(ctx context.Context, method, path string, body []byte, auth bool) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	client, base := c.Client()
	// The transport is this call's own: leave no idle connection behind
	// to count against the admin listener's per-source limit.
	defer client.CloseIdleConnections()
	u := base + path
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	if auth && !strings.HasPrefix(c.Addr, "unix://") {
		if err := TokenTransportOK(c.Addr); err != nil {
			return "", err
		}
		tok, err := c.Token()
		if err != nil {
			return "", err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("%w (is the server running? its admin address is --admin)", err)
	}
	defer resp.Body.Close()
	out, err := bundledoc.ReadLimited(resp.Body, 16<<20)
	if err != nil {
		return "", err
	}
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("%s %s: %s: %s", method, u, resp.Status, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// relay sends one request, as do, and copies the server's answer to w.
func (c *AdminClient) Relay(ctx context.Context, w io.Writer, method, path string, body []byte, auth bool) error {
	out, err := c.Do(ctx, method, path, body, auth)
	if err != nil {
		return err
	}
	_, err = io.WriteString(w, out)
	return err
}

// client is the HTTP client and base URL of c.addr: "unix://PATH" is the
// server's --admin-socket, where the socket's mode stands for the token.
// Neither follows a proxy (HTTP_PROXY would see the token) nor a redirect
// (Go keeps the token on a redirect to the same host, even to http).
func (c *AdminClient) Client() (*http.Client, string) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	base := strings.TrimRight(c.Addr, "/")
	if path, ok := strings.CutPrefix(c.Addr, "unix://"); ok {
		var d net.Dialer
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		}
		base = "http://localhost"
	}
	return &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}, base
}

// tokenTransportOK refuses to let the admin token leave the host in clear
// text: it goes over https, or plain http to a loopback host only. The
// admin listener may bind 0.0.0.0 (the Helm chart does), which makes an
// http://POD-IP address work, and sends the token over the pod network.
func TokenTransportOK(addr string) error {
	u, err := url.Parse(addr)
	if err != nil {
		return fmt.Errorf("--admin %q: %w", addr, err)
	}
	switch {
	case u.Scheme == "https":
		return nil
	case u.Scheme == "http" && isLoopbackHost(u.Hostname()):
		return nil
	case u.Scheme != "http":
		return fmt.Errorf("--admin %q: want http://127.0.0.1:PORT, https://HOST:PORT or unix://PATH", addr)
	}
	return fmt.Errorf("--admin %s: refusing to send the admin token in clear text to a host that is not loopback "+
		"(plain http is for 127.0.0.0/8, ::1 or localhost); run this on the server's host, use its --admin-socket "+
		"(--admin unix://PATH), or forward the admin port to loopback (kubectl port-forward POD 15014) and use --admin http://127.0.0.1:15014", addr)
}

func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// adminFrom is the client of a federation subcommand: --admin is the
// parent's persistent flag.
func AdminFrom(cmd *cobra.Command, c *AdminClient) *AdminClient {
	if f := cmd.Flag("admin"); f != nil {
		c.Addr = f.Value.String()
	}
	return c
}

// newFederationManageCmds are federation add, remove and list.
func newFederationManageCmds(e Env) []*cobra.Command {
	return []*cobra.Command{newFederationAddCmd(e), newFederationRemoveCmd(e), newFederationListCmd(e)}
}

type federationAddOptions struct {
	endpointID string
	bundle     string
	force      bool
	noFetch    bool
}

func newFederationAddCmd(e Env) *cobra.Command {
	var (
		c AdminClient
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
			return AdminFrom(cmd, &c).Relay(cmd.Context(), e.Out, http.MethodPost, o.path(), body, true)
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
		doc, err := ReadSmallFile(o.bundle, bundledoc.DefaultMaxSize)
		if err != nil {
			return nil, fmt.Errorf("--bundle: %w", err)
		}
		item["trustDomainBundle"] = string(doc)
	}
	return json.Marshal(map[string]any{"federation": []any{item}})
}

func newFederationRemoveCmd(e Env) *cobra.Command {
	var c AdminClient
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
			return AdminFrom(cmd, &c).Relay(cmd.Context(), e.Out, http.MethodDelete, "/v1/federation/relationships/"+url.PathEscape(td.Name()), nil, true)
		},
	}
	c.AddAuthFlags(cmd.Flags())
	return cmd
}

func newFederationListCmd(e Env) *cobra.Command {
	var c AdminClient
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
	out := AddOutputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := out.Check(); err != nil {
			return err
		}
		body, err := AdminFrom(cmd, &c).Do(cmd.Context(), http.MethodGet, "/v1/federation/relationships", nil, false)
		if err != nil {
			return err
		}
		var rels []admin.Relationship
		if err := json.Unmarshal([]byte(body), &rels); err != nil {
			return fmt.Errorf("admin answer: %w", err)
		}
		return out.Write(e.Out, rels, func(w io.Writer) error { return relationshipsTable(w, rels) })
	}
	return cmd
}

func relationshipsTable(w io.Writer, rels []admin.Relationship) error {
	if len(rels) == 0 {
		_, err := fmt.Fprintln(w, "no federated trust domains")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TRUST DOMAIN\tORIGIN\tPROFILE\tSTATE\tENDPOINT URL\tENDPOINT SPIFFE ID")
	for _, r := range rels {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.TrustDomain, orDash(r.Origin), orDash(r.Profile), orDash(strings.ToUpper(r.State)),
			orDash(Printable(r.EndpointURL)), orDash(r.EndpointSPIFFEID))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
